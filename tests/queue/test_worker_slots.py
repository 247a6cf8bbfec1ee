"""A worker's handler slots (`--concurrency`): runs executed at once up to the limit and
never beyond, each slot's run leased and renewed on its own account, finished runs
recorded with the next claim, and SIGTERM finishing every run in hand."""

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import text

from rota.pipelines.queue.enqueue import enqueue_scheduled_many
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.worker_settings import WorkerSettings
import tests.worker_handlers  # noqa: F401 - registers "sleep" for the in-process worker
from tests.helpers import worker_in_a_thread
from tests.queue.test_queue import T0, runs, start_worker, stop, wait_for


def _handler_calls_table(engine):
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))


def _sleeping_runs(engine, count, seconds):
    job_id = register_job(engine, "sleep", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(count)])
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET payload = jsonb_build_object('seconds', CAST(:s AS float))"),
                     {"s": seconds})
    return job_id


def _running(engine):
    return len(runs(engine, "state = 'running'"))


def test_a_worker_executes_up_to_its_concurrency_at_once_and_never_more(database_url, engine):
    _handler_calls_table(engine)
    _sleeping_runs(engine, 7, 1.0)
    worker = start_worker(database_url, "--concurrency", "3")
    seen = []
    try:
        deadline = time.monotonic() + 60
        while len(runs(engine, "state = 'succeeded'")) < 7:
            assert time.monotonic() < deadline, "timed out waiting for the runs"
            seen.append(_running(engine))
            time.sleep(0.05)
    finally:
        code, output = stop(worker)
    assert code == 0, output
    assert max(seen) == 3, seen
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*), count(DISTINCT run_id), max(attempt) FROM handler_call"))\
            .one() == (7, 7, 1)


def test_a_slow_handler_holds_up_none_of_its_workers_other_slots(database_url, engine):
    _handler_calls_table(engine)
    slow = _sleeping_runs(engine, 1, 30.0)
    fast = register_job(engine, "count", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(fast, T0 + timedelta(hours=1, minutes=n)) for n in range(100)])
    worker = start_worker(database_url, "--concurrency", "2")
    try:
        wait_for(lambda: len(runs(engine, f"job_id = {fast} AND state = 'succeeded'")) == 100, 25,
                 "the fast runs to finish beside the slow one")
        assert runs(engine, f"job_id = {slow}")[0]["state"] == "running"
    finally:
        worker.kill()
        worker.communicate(timeout=30)


def test_a_busy_worker_records_finished_runs_with_its_next_claim(database_url, engine):
    """A run's finished_at is its recording transaction's start: 300 runs through ten slots
    share at most a hundred of them (one commit per run would give 300)."""
    _handler_calls_table(engine)
    job_id = register_job(engine, "count", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0 - timedelta(minutes=n)) for n in range(300)])
    worker = start_worker(database_url, "--concurrency", "10")
    try:
        wait_for(lambda: not runs(engine, "state <> 'succeeded'"), 60, "the queue to drain")
    finally:
        code, output = stop(worker)
    assert code == 0, output
    with engine.connect() as conn:
        commits = conn.execute(text("SELECT count(DISTINCT finished_at) FROM job_queue")).scalar_one()
    assert commits <= 100, commits


def test_every_run_in_hand_has_its_lease_renewed(database_url, engine):
    """Three slots, three handlers outliving the lease twice over: no run is reclaimed, and
    the worker never believes a lease lost."""
    _handler_calls_table(engine)
    _sleeping_runs(engine, 3, 4.5)
    settings = WorkerSettings(lease=timedelta(seconds=2), poll_interval=0.05, concurrency=3, reclaim_interval=0.2)
    with worker_in_a_thread(database_url, settings) as gave_up:
        wait_for(lambda: len(runs(engine, "state = 'succeeded'")) == 3, 30, "the three runs")
    assert not gave_up
    assert [(r["attempts"], r["last_error"]) for r in runs(engine)] == [(1, None)] * 3


def test_sigterm_finishes_every_run_in_hand_and_claims_no_more(database_url, engine):
    _handler_calls_table(engine)
    _sleeping_runs(engine, 6, 1.5)
    worker = start_worker(database_url, "--concurrency", "3", "--grace", "10")
    wait_for(lambda: _running(engine) == 3, 60, "three runs to start")
    code, output = stop(worker)
    assert code == 0, output
    states = sorted(r["state"] for r in runs(engine))
    assert states == ["queued"] * 3 + ["succeeded"] * 3, states
    assert all(r["attempts"] == 0 for r in runs(engine, "state = 'queued'"))


def test_a_concurrency_below_one_is_refused_by_name():
    done = subprocess.run([str(Path(sys.executable).parent / "rota"), "worker", "--concurrency", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--concurrency: must be a whole number of at least 1, not '0'" in done.stderr
