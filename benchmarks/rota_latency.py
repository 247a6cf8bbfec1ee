"""The handler `python -m benchmarks` drains rota's queue with: a no-op like the baselines' (rota's
own `noop` logs each run), which, for the latency case, writes how long after its run fell
due it started (see benchmarks.queue_baselines.record)."""

from benchmarks.queue_baselines import record
from rota.pipelines.queue.claims import ClaimedRun
from rota.pipelines.queue.handlers import handler


@handler("bench_noop")
def bench_noop(run: ClaimedRun, engine) -> None:
    record(run.scheduled_for.timestamp())
