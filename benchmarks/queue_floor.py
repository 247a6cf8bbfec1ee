"""The floor of the claim latency: the least path SPEC §5 leaves from a run falling due to its
handler starting, with none of rota's worker around it. The producer's plain INSERT into
job_queue, a transaction of its own (autocommit), whose commit sends job_queue_wakes_workers'
NOTIFY; one listener woken by it, so that no notification wakes a process that then loses
the claim; rota's one-statement claim (job_queue_complete_and_claim: FOR UPDATE SKIP LOCKED
over the claim index, with a lease), its own transaction; the "handler" started in the
thread that claimed, with no pool, no worker loop and no hand-off to a handler thread.
Enqueueing never touches claims (SPEC §5), so no step of it can be left out. Runs in rota's
virtualenv:

    python -m benchmarks.queue_floor work            the listener, until SIGTERM
    python -m benchmarks.queue_floor produce JOB N RATE

The database comes from BENCH_CONNINFO; a listener writes each run's latency as the
baselines' workers do (benchmarks.queue_baselines.record)."""

import os
import signal
import sys
import time
from dataclasses import fields
from datetime import datetime, timezone

import psycopg

from benchmarks.queue_baselines import CONCURRENCY, record
from rota.pipelines.queue.claims import ClaimedRun
from rota.resources.database.queries import queries

CLAIM = queries("rota.pipelines.queue")["complete_and_claim"]
# The claim's columns: the runs recorded, then ClaimedRun's fields.
SCHEDULED_FOR = 1 + [field.name for field in fields(ClaimedRun)].index("scheduled_for")


def work(conninfo: str) -> None:
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    conn = psycopg.connect(conninfo, autocommit=True)
    conn.execute("LISTEN rota_runs_queued")
    worker, finished = f"floor-{os.getpid()}", []
    while not stopped:
        if not list(conn.notifies(timeout=0.25, stop_after=1)) and not finished:
            continue
        rows = conn.execute(CLAIM, {"finished": finished, "worker": worker, "limit": CONCURRENCY,
                                    "lease": 60.0}).fetchall()
        finished = []
        for row in rows:
            if row[1] is not None:
                record(row[SCHEDULED_FOR].timestamp())
                finished.append(row[1])


def produce(conninfo: str, job_id: int, count: int, rate: float) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        started = time.monotonic()
        for n in range(count):
            time.sleep(max(0.0, started + n / rate - time.monotonic()))
            due = datetime.now(timezone.utc)
            conn.execute("INSERT INTO job_queue (job_id, scheduled_for, run_at) VALUES (%s, %s, %s)",
                         (job_id, due, due))


def main(argv: list[str]) -> None:
    conninfo = os.environ["BENCH_CONNINFO"]
    if argv[0] == "work":
        work(conninfo)
    elif argv[0] == "produce":
        produce(conninfo, int(argv[1]), int(argv[2]), float(argv[3]))
    else:
        raise SystemExit(f"unknown command {argv[0]!r}: work or produce")


if __name__ == "__main__":
    main(sys.argv[1:])
