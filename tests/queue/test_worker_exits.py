"""A finished run never runs again, whatever way its worker leaves: a run whose handler
returned inside the grace is recorded before the process exits, and a handler's failure
is never taken for a lost lease (which would end the worker and its siblings' runs)."""

import time
from datetime import timedelta

from sqlalchemy import text

import rota.pipelines.queue.worker
from rota.pipelines.queue.claims import reclaim_expired
from rota.pipelines.queue.enqueue import enqueue_scheduled_many
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.worker_settings import WorkerSettings
import tests.worker_handlers  # noqa: F401 - registers "sleep" and "boom" for the in-process worker
from tests.helpers import worker_in_a_thread
from tests.queue.test_queue import T0, runs, start_worker, wait_for
from tests.queue.test_worker_slots import _handler_calls_table


def _calls(engine) -> dict[int, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT run_id, count(*) FROM handler_call GROUP BY run_id")).all())


def test_a_run_that_returned_inside_the_grace_is_recorded_before_the_worker_exits(database_url, engine):
    """SIGTERM while a 1.5 s and an 8 s handler run, grace 3 s: the quick run is recorded as
    it returns; the slow one is handed back at the deadline and only it runs again."""
    _handler_calls_table(engine)
    job_id = register_job(engine, "sleep", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0), (job_id, T0 + timedelta(minutes=1))])
    with engine.begin() as conn:
        quick, slow = conn.execute(text("SELECT id FROM job_queue ORDER BY scheduled_for")).scalars()
        conn.execute(text("UPDATE job_queue SET payload = jsonb_build_object('seconds', CASE id WHEN :quick "
                          "THEN 1.5 ELSE 8 END)"), {"quick": quick})
    worker = start_worker(database_url, "--concurrency", "2", "--grace", "3")
    wait_for(lambda: len(runs(engine, "state = 'running'")) == 2, 60, "both runs to start")
    worker.terminate()
    output, _ = worker.communicate(timeout=30)
    states = {r["id"]: r["state"] for r in runs(engine)}
    assert states[quick] == "succeeded", (states, output)
    # The slow run, interrupted, is taken again once its shortened lease runs out; the quick never.
    again = start_worker(database_url, "--concurrency", "2", "--grace", "10")
    try:
        wait_for(lambda: runs(engine, f"id = {slow}")[0]["state"] == "succeeded", 60, "the slow run to be rerun")
    finally:
        again.terminate()
        again.communicate(timeout=30)
    assert _calls(engine) == {quick: 1, slow: 2}


def test_a_handlers_failure_is_never_taken_for_a_lost_lease(database_url, engine, monkeypatch):
    """Recording a failure clears the run's lease: a heartbeat that looks while the failure
    is being recorded must not see a lease lost and end the worker."""
    _handler_calls_table(engine)
    boom = register_job(engine, "boom", schedule="* * * * *", max_attempts=1)
    enqueue_scheduled_many(engine, [(boom, T0)])
    recorded = rota.pipelines.queue.worker.fail

    def slow_to_return(*args, **kwargs):
        state = recorded(*args, **kwargs)
        time.sleep(1.5)  # past a third of the lease: the heartbeat renews what it holds
        return state

    monkeypatch.setattr(rota.pipelines.queue.worker, "fail", slow_to_return)
    settings = WorkerSettings(lease=timedelta(seconds=1.5), poll_interval=0.05)
    with worker_in_a_thread(database_url, settings) as gave_up:
        wait_for(lambda: runs(engine)[0]["state"] == "failed", 30, "the run to fail")
        time.sleep(2)
    assert not gave_up


def test_a_bug_in_renewing_leases_stops_the_worker_with_its_traceback_not_as_a_lost_lease(database_url, engine):
    """A renewal that raises anything but the database going away is a bug: retrying it in
    silence ran the lease out, and the worker exited 75 as if another had taken the run.
    It stops at once with the traceback, its own exit status, and the run says why."""
    _handler_calls_table(engine)
    job_id = register_job(engine, "sleep", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0)])
    with engine.begin() as conn:  # runs past a third of the lease: the heartbeat must renew it
        conn.execute(text("UPDATE job_queue SET payload = jsonb_build_object('seconds', 4)"))
    worker = start_worker(database_url, "--lease", "3", "--handlers", "tests.worker_handlers,tests.heartbeat_bug")
    output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 70, output
    assert "Traceback" in output and "TypeError: extend_leases() takes 4 positional arguments" in output, output
    assert "CRITICAL" in output and "lease of run" not in output, output
    time.sleep(3.5)  # the interrupted lease runs out
    assert reclaim_expired(engine) == {"queued": 1}
    [run] = runs(engine)
    assert run["last_error"].startswith("interrupted: worker ") and "renewing its leases failed (TypeError" in run[
        "last_error"], run["last_error"]
