"""Handlers the worker tests register (loaded with `rota worker --handlers tests.worker_handlers`)."""

import time

from sqlalchemy import text

from rota.pipelines.queue.handlers import handler

RECORD = text("INSERT INTO handler_call (run_id, attempt, job) VALUES (:run_id, :attempt, :job)")


def record(run, engine) -> None:
    with engine.begin() as conn:
        conn.execute(RECORD, {"run_id": run.id, "attempt": run.attempts, "job": run.job_name})


@handler("count")
def count(run, engine):
    record(run, engine)


@handler("sleep")
def sleep(run, engine):
    record(run, engine)
    time.sleep(float(run.payload.get("seconds", 5)))


@handler("boom")
def boom(run, engine):
    record(run, engine)
    raise RuntimeError(f"boom on attempt {run.attempts}: it's a \"quoted\" failure; DROP TABLE job;")


@handler("count-events")
def count_events(run, engine):
    record(run, engine)


@handler("whose")
def whose(run, engine):
    """Records which worker holds the run (its lease owner) as the call's job."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO handler_call (run_id, attempt, job) "
                          "SELECT id, attempts, lease_owner FROM job_queue WHERE id = :run_id"), {"run_id": run.id})
