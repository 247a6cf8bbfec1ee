"""The queue over months (issue 12): identities outlive retention, operators' changes
stick, an edited cron runs only its new fire times, and one run never runs twice at once."""

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from dagster import DagsterInstance, materialize
from sqlalchemy import create_engine, text

import tests.worker_handlers  # noqa: F401 - registers the handlers the in-process worker runs
from rota.pipelines.definitions import defs
from rota.pipelines.queue.enqueue import AlreadyQueued, enqueue_scheduled, enqueue_scheduled_many
from rota.pipelines.queue.events import dispatch_pending_events
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import produce
from rota.pipelines.queue.worker import Worker
from rota.pipelines.queue.worker_settings import WorkerSettings
from rota.pipelines.sources.nightly import compact_finished_runs, nightly_ref
from rota.resources.database.server import driver_url
from rota.resources.maintenance import MaintenanceSettings
from tests.helpers import claim_due_runs, database_fingerprint, rows_only, worker_in_a_thread
from tests.queue.test_queue import add_event, runs, start_worker, stop, wait_for

T0 = datetime(2024, 6, 1, 12, 0, tzinfo=timezone.utc)


def _finish_long_ago(engine, days=900):
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET state = 'succeeded', last_error = 'an old error', "
                          "finished_at = now() - make_interval(days => :d)"), {"d": days})


def test_a_run_compacted_by_maintenance_is_never_produced_again(engine, capsys):
    """Each of the three identities, finished 900 days ago and past a 450-day retention:
    the fire time, the event and the source ref produce nothing new."""
    cron = register_job(engine, "report", schedule="0 12 * * *")
    register_job(engine, "mailer", event_type="ping")
    register_job(engine, "github-issue")
    enqueue_scheduled(engine, cron, T0)
    event_id = add_event(engine, "ping", payload={"invoice": 7})
    dispatch_pending_events(engine)
    produce(engine, "github", "octo/cat#1", "github-issue", {"title": "Old issue"})
    _finish_long_ago(engine)
    assert compact_finished_runs(engine, MaintenanceSettings(retention_days=450)) == 3
    with engine.connect() as conn:
        rows, heap = conn.execute(text("SELECT count(*), sum(pg_column_size(q.*)) FROM job_queue q")).one()
        assert conn.execute(text("SELECT count(*) FROM job_queue WHERE payload <> '{}' OR last_error IS NOT NULL"))\
            .scalar_one() == 0
    before = database_fingerprint(engine)

    assert isinstance(enqueue_scheduled(engine, cron, T0), AlreadyQueued)
    assert enqueue_scheduled_many(engine, [(cron, T0)]) == []
    with engine.begin() as conn:  # a restored event table, or a replayed sensor
        conn.execute(text("UPDATE event SET dispatched_at = NULL WHERE id = :e"), {"e": event_id})
    assert dispatch_pending_events(engine) == (1, 0)
    assert produce(engine, "github", "octo/cat#1", "github-issue", {"title": "Edited since"}) == "unchanged"
    assert len(runs(engine)) == 3
    after = database_fingerprint(engine)
    # Rows only: enqueue_scheduled's single-row insert draws an identity value before it conflicts.
    assert {k: v for k, v in rows_only(after).items() if k != "event"} == \
        {k: v for k, v in rows_only(before).items() if k != "event"}
    with capsys.disabled():
        print(f"\ncompacted runs: {rows} rows kept, {heap / rows:.0f} bytes of row data each")


def test_a_nightly_backfill_of_a_compacted_night_produces_nothing(engine):
    day = (datetime.now(timezone.utc) - timedelta(days=600)).date()
    key = day.isoformat()
    assert _nights(key, key).success
    _finish_long_ago(engine)
    compact_finished_runs(engine, MaintenanceSettings(retention_days=450))
    before = database_fingerprint(engine)
    assert _nights(key, key).success
    assert database_fingerprint(engine) == before
    assert [r["source_ref"] for r in runs(engine)] == [nightly_ref(day)]


def _nights(first, last):
    from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG

    return materialize([defs.resolve_assets_def("nightly_maintenance")], instance=DagsterInstance.ephemeral(),
                       tags={PARTITION_RANGE_START_TAG: first, PARTITION_RANGE_END_TAG: last})


# ------------------------------------------------------------------ the operator's say

def test_registration_never_reverts_what_an_operator_set(engine):
    key = (datetime.now(timezone.utc) - timedelta(days=3)).date().isoformat()
    assert _nights(key, key).success
    with engine.begin() as conn:
        conn.execute(text("UPDATE job SET enabled = false, max_attempts = 9 WHERE name = 'nightly-maintenance'"))
    before = database_fingerprint(engine)
    assert _nights(key, key).success
    register_job(engine, "nightly-maintenance")
    register_job(engine, "nightly-maintenance", max_attempts=3)
    assert database_fingerprint(engine) == before
    # Nor raise what the operator lowered: a Source registers its job at every poll.
    with engine.begin() as conn:
        conn.execute(text("UPDATE job SET max_attempts = 2 WHERE name = 'nightly-maintenance'"))
    register_job(engine, "nightly-maintenance", max_attempts=12)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT enabled, max_attempts FROM job WHERE name = 'nightly-maintenance'")).one() \
            == (False, 2)


def test_demo_data_goes_only_into_an_empty_embedded_database(database_url, engine, monkeypatch):
    from rota.pipelines.cli.dev import prepare

    class Given:
        url = database_url
        embedded = False

    prepare(Given())
    with engine.connect() as conn:
        assert conn.execute(text("SELECT (SELECT count(*) FROM duty), (SELECT count(*) FROM job)")).one() == (0, 0)
    Given.embedded = True
    prepare(Given())
    with engine.begin() as conn:
        duties = conn.execute(text("SELECT count(*) FROM duty")).scalar_one()
        conn.execute(text("UPDATE job SET enabled = false WHERE name = 'noop'"))
        conn.execute(text("DELETE FROM duty"))
    assert duties > 1000
    prepare(Given())  # a job is there: not empty, nothing touched
    with engine.connect() as conn:
        assert conn.execute(text("SELECT (SELECT count(*) FROM duty), (SELECT bool_or(enabled) FROM job)")).one() \
            == (0, False)


# ------------------------------------------------------------------ an edited cron

def _queued_fire_times(engine, job_id):
    with engine.connect() as conn:
        return conn.execute(text("SELECT scheduled_for, state FROM job_queue WHERE job_id = :j ORDER BY 1"),
                            {"j": job_id}).all()


def test_editing_a_cron_in_code_cancels_its_queued_old_fire_times(engine):
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    job_id = register_job(engine, "report", schedule="0 * * * *")
    enqueue_scheduled_many(engine, [(job_id, hour), (job_id, hour + timedelta(hours=1))])
    started = claim_due_runs(engine, "w", 1, timedelta(minutes=5))  # nothing due yet
    assert started == []
    register_job(engine, "report", schedule="30 * * * *")
    assert [state for _, state in _queued_fire_times(engine, job_id)] == ["cancelled", "cancelled"]
    with engine.connect() as conn:
        assert "no longer fires at" in conn.execute(text("SELECT min(last_error) FROM job_queue")).scalar_one()


def test_an_operators_cron_edit_is_applied_by_the_next_scheduled_runs_materialisation(engine):
    from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG

    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    key = hour.strftime("%Y-%m-%d-%H:%M")
    job_id = register_job(engine, "report", schedule="0 * * * *")
    kept = register_job(engine, "other", schedule="15 * * * *")

    def deliver():
        return materialize([defs.resolve_assets_def("scheduled_runs")], instance=DagsterInstance.ephemeral(),
                           tags={PARTITION_RANGE_START_TAG: key, PARTITION_RANGE_END_TAG: key})

    assert deliver().success
    assert [at for at, _ in _queued_fire_times(engine, job_id)] == [hour]
    with engine.begin() as conn:  # by hand, after the hour was queued
        conn.execute(text("UPDATE job SET schedule = '45 * * * *' WHERE id = :j"), {"j": job_id})
    assert deliver().success
    assert _queued_fire_times(engine, job_id) == [(hour, "cancelled"), (hour + timedelta(minutes=45), "queued")]
    assert _queued_fire_times(engine, kept) == [(hour + timedelta(minutes=15), "queued")]


def test_a_started_run_is_never_cancelled_by_a_cron_edit(engine):
    past = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=5)
    job_id = register_job(engine, "report", schedule="* * * * *")
    enqueue_scheduled(engine, job_id, past)
    (claimed,) = claim_due_runs(engine, "w", 1, timedelta(minutes=5))
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL "
                          "WHERE id = :r"), {"r": claimed.id})  # its first attempt failed: a retry waits
    register_job(engine, "report", schedule="0 0 1 1 *")
    assert _queued_fire_times(engine, job_id) == [(past, "queued")]


# ------------------------------------------------------------ one run, one worker at a time

def test_a_worker_stops_its_handler_before_an_unrenewable_lease_can_expire(database_url, engine):
    """The renewal hangs (a lock on the run's row): the worker must give up the handler
    while its lease still runs, so the run cannot be handed on during it."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))
    job_id = register_job(engine, "sleep", schedule="* * * * *")
    run_id = enqueue_scheduled(engine, job_id, T0).run_id
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET payload = '{\"seconds\": 4}' WHERE id = :r"), {"r": run_id})
    settings = WorkerSettings(lease=timedelta(seconds=3), poll_interval=0.05)
    with worker_in_a_thread(database_url, settings) as gave_up:
        holder = engine.connect()
        try:
            wait_for(lambda: runs(engine)[0]["state"] == "running", 30, "the run to start")
            claimed_at = time.monotonic()
            holder.execute(text("SELECT 1 FROM job_queue WHERE id = :r FOR UPDATE"), {"r": run_id})
            expires = holder.execute(text("SELECT lease_expires_at - clock_timestamp() FROM job_queue WHERE id = :r"),
                                     {"r": run_id}).scalar_one()
            wait_for(lambda: gave_up, 10, "the worker to give up")
            assert gave_up[0] - claimed_at < expires.total_seconds(), (gave_up, claimed_at, expires)
        finally:
            holder.rollback()
            holder.close()


@pytest.mark.slow
def test_one_slow_handler_holds_up_nothing_another_worker_could_run(database_url, engine):
    """Four `rota worker`s, one handler that sleeps 30 s and 200 fast runs: the fast runs
    all finish while the slow one is still running."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))
    slow = register_job(engine, "sleep", schedule="* * * * *")
    fast = register_job(engine, "count", schedule="* * * * *")
    slow_run = enqueue_scheduled(engine, slow, T0 - timedelta(hours=1)).run_id
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET payload = '{\"seconds\": 30}' WHERE id = :r"), {"r": slow_run})
    enqueue_scheduled_many(engine, [(fast, T0 + timedelta(minutes=n)) for n in range(200)])
    workers = [start_worker(database_url) for _ in range(4)]
    try:
        wait_for(lambda: len(runs(engine, "job_id = %d AND state = 'succeeded'" % fast)) == 200, 25,
                 "the fast runs to finish")
        assert runs(engine, f"id = {slow_run}")[0]["state"] == "running"
    finally:
        for worker in workers:
            worker.kill()
            worker.communicate(timeout=30)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*), count(DISTINCT run_id) FROM handler_call WHERE job = 'count'"))\
            .one() == (200, 200)


# ------------------------------------------------------------ waking without polling

def _idle_worker(database_url, listen):
    """An in-process worker whose poll (a minute) could not explain a prompt start."""
    worker_engine = create_engine(driver_url(database_url))
    worker = Worker(worker_engine, WorkerSettings(poll_interval=60, listen=listen))
    thread = threading.Thread(target=worker.run)
    thread.start()
    return worker, thread, worker_engine


def _stop_idle(worker, thread, worker_engine):
    worker.stopping.set()
    thread.join(timeout=90)
    worker_engine.dispose()
    assert not thread.is_alive()


@pytest.mark.parametrize("listen", [True, False])
def test_an_idle_worker_starts_a_run_queued_for_now_without_waiting_out_its_poll(database_url, engine, listen):
    """Migration 0010's NOTIFY wakes a listening worker; one that does not listen waits
    out its minute (the run is still queued when the listening one has long finished)."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))
    job_id = register_job(engine, "count", schedule="* * * * *")
    worker, thread, worker_engine = _idle_worker(database_url, listen)
    try:
        time.sleep(2)  # idle, past its first empty claim
        enqueue_scheduled(engine, job_id, datetime.now(timezone.utc))
        if listen:
            wait_for(lambda: runs(engine)[0]["state"] == "succeeded", 20, "the notified worker to run it")
        else:
            time.sleep(10)
            assert runs(engine)[0]["state"] == "queued"
    finally:
        _stop_idle(worker, thread, worker_engine)


def test_idle_workers_that_lost_a_race_still_take_what_the_winner_leaves(database_url, engine):
    """A worker whose last notified claim found nothing claims a moment later at the next
    notification (its benefit is measured by the benchmarks' latency case, not here). It
    must still claim: three runs queued at once start on three one-slot workers together,
    long before their minute's poll."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))
    job_id = register_job(engine, "whose")
    sleeper = register_job(engine, "sleep")
    workers = [start_worker(database_url, "--poll", "60") for _ in range(3)]
    try:
        time.sleep(3)  # idle, past their first empty claims
        for n in range(1, 6):  # races: two workers lose each
            enqueue_scheduled(engine, job_id, datetime.now(timezone.utc))
            wait_for(lambda: len(runs(engine, "state = 'succeeded'")) == n, 20, f"run {n} to be run")
        now = datetime.now(timezone.utc)
        enqueue_scheduled_many(engine, [(sleeper, now - timedelta(seconds=n)) for n in range(3)])  # 5 s each
        wait_for(lambda: len(runs(engine, "state = 'running'")) == 3, 4, "three workers to run the three runs")
        assert len({row["lease_owner"] for row in runs(engine, "state = 'running'")}) == 3
    finally:
        outcomes = [stop(worker) for worker in workers]
    assert all(code == 0 for code, _ in outcomes), outcomes


def test_an_idle_worker_wakes_when_the_earliest_queued_run_falls_due(database_url, engine):
    """No notification comes for a run queued earlier for later: the worker sleeps only
    until it is due, not a whole poll."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))
    job_id = register_job(engine, "count", schedule="* * * * *")
    enqueue_scheduled(engine, job_id, datetime.now(timezone.utc) + timedelta(seconds=4))
    worker, thread, worker_engine = _idle_worker(database_url, listen=False)
    try:
        wait_for(lambda: runs(engine)[0]["state"] == "succeeded", 30, "the worker to run it when due")
    finally:
        _stop_idle(worker, thread, worker_engine)
