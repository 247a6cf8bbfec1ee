"""Cron fire times (DST policy pinned), the scheduled-runs asset and the queue sensors."""

import re
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from dagster import DagsterInstance, build_sensor_context, materialize
from sqlalchemy import insert, text

from rota.pipelines.definitions import defs
from rota.pipelines.queue.assets import FIRE_TIMES_CHECK, LIVE_TAG, SCHEDULED_RUNS
from rota.pipelines.queue.cron import InvalidCron
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import produce_many
from rota.pipelines.sources.nightly import compact_finished_runs
from rota.resources.database.schema import event
from rota.resources.database.server import libpq_url
from rota.resources.maintenance import MaintenanceSettings
from tests.helpers import claim_due_runs, database_fingerprint

UTC = timezone.utc


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def iso(instants):
    return [t.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ") for t in instants]


def test_a_job_with_an_invalid_cron_is_refused_by_rota_and_by_the_database(engine):
    with pytest.raises(InvalidCron, match="61 \\* \\* \\* \\*"):
        register_job(engine, "bad", schedule="61 * * * *")
    with pytest.raises(Exception, match="job_schedule_cron_shape"):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO job (name, schedule) VALUES ('bad', 'every day')"))


def materialize_hours(first, last, as_of=None, live=False, raise_on_error=True):
    return materialize(
        [defs.resolve_assets_def(SCHEDULED_RUNS)],
        instance=DagsterInstance.ephemeral(),
        tags={"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last,
              **({LIVE_TAG: "true"} if live else {})},
        run_config={"ops": {SCHEDULED_RUNS: {"config": {"as_of": as_of}}}} if as_of else None,
        raise_on_error=raise_on_error,
    )


def queued(engine):
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT j.name, q.scheduled_for FROM job_queue q JOIN job j ON j.id = q.job_id "
            "ORDER BY 2, 1")).all()


def test_an_hourly_backfill_enqueues_every_fire_time_once(engine):
    register_job(engine, "quarter-hourly", schedule="*/15 * * * *")
    register_job(engine, "ny-nightly", schedule="30 2 * * *", timezone="America/New_York")
    register_job(engine, "off", schedule="* * * * *", enabled=False)
    register_job(engine, "events-only", event_type="ping")
    result = materialize_hours("2026-03-08-06:00", "2026-03-08-07:00")
    assert result.success
    rows = queued(engine)
    assert [(name, t.astimezone(UTC).strftime("%H:%M")) for name, t in rows] == [
        ("quarter-hourly", "06:00"), ("quarter-hourly", "06:15"), ("quarter-hourly", "06:30"),
        ("quarter-hourly", "06:45"), ("ny-nightly", "07:00"), ("quarter-hourly", "07:00"),
        ("quarter-hourly", "07:15"), ("quarter-hourly", "07:30"), ("quarter-hourly", "07:45")]
    check = result.get_asset_check_evaluations()[0]
    assert (check.check_name, check.passed) == (FIRE_TIMES_CHECK, True)
    before = database_fingerprint(engine)
    assert materialize_hours("2026-03-08-06:00", "2026-03-08-07:00").success
    assert database_fingerprint(engine) == before


def owed_since(engine, name, instant):
    with engine.begin() as conn:
        conn.execute(text("UPDATE job SET scheduled_since = :t WHERE name = :n"), {"t": instant, "n": name})


def test_live_delivery_leaves_stale_fire_times_for_a_visible_backfill(engine):
    register_job(engine, "every-ten", schedule="*/10 * * * *")
    owed_since(engine, "every-ten", "2026-08-31T09:00:00Z")
    live = materialize_hours("2026-08-31-10:00", "2026-08-31-10:00", as_of="2026-08-31T10:40:00Z", live=True)
    assert iso(t for _, t in queued(engine)) == ["2026-08-31T10:30Z", "2026-08-31T10:40Z", "2026-08-31T10:50Z"]
    check = live.get_asset_check_evaluations()[0]
    assert not check.passed and check.metadata["missing"].value == 3
    backfill = materialize_hours("2026-08-31-10:00", "2026-08-31-10:00", as_of="2026-08-31T10:40:00Z")
    assert len(queued(engine)) == 6 and backfill.get_asset_check_evaluations()[0].passed


def test_a_job_owes_no_fire_time_from_before_it_was_scheduled(engine):
    """A fresh install's first hour, or a job registered mid-hour: the fire times before it
    were never owed, so live delivery neither queues nor reports them, even inside the
    catch-up window (issue 39: a job registered at 03:01:41 ran its 03:00); a backfill
    still queues them when an operator asks."""
    register_job(engine, "every-ten", schedule="*/10 * * * *")
    owed_since(engine, "every-ten", "2026-08-31T10:31:00Z")  # registered a minute after 10:30
    live = materialize_hours("2026-08-31-10:00", "2026-08-31-10:00", as_of="2026-08-31T10:32:00Z", live=True)
    check = live.get_asset_check_evaluations()[0]
    assert check.passed and check.metadata["stale_not_queued"].value == 0
    assert iso(t for _, t in queued(engine)) == ["2026-08-31T10:40Z", "2026-08-31T10:50Z"]
    with engine.begin() as conn:
        conn.execute(text("UPDATE job SET schedule = '*/20 * * * *' WHERE name = 'every-ten'"))
        moved = conn.execute(text("SELECT scheduled_since > '2026-12-01' FROM job WHERE name = 'every-ten'")).scalar()
    assert moved, "a new cron is owed from when it was set"
    backfill = materialize_hours("2026-08-31-10:00", "2026-08-31-10:00", as_of="2026-08-31T10:40:00Z")
    assert backfill.get_asset_check_evaluations()[0].passed
    assert iso(t for _, t in queued(engine))[:2] == ["2026-08-31T10:00Z", "2026-08-31T10:20Z"]


@pytest.mark.parametrize("cron", ["99 * * * *", "0 0 31 2 *"])
def test_a_job_whose_cron_cannot_be_planned_fails_the_hours_check_by_name_and_stops_no_other(engine, cron):
    """Written past register_job (which refuses both): the right shape, but no such minute,
    or no such day. Every hour reports it at ERROR; the other jobs' fire times are queued."""
    register_job(engine, "fine", schedule="0 * * * *")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO job (name, schedule) VALUES ('broken', :cron)"), {"cron": cron})
    result = materialize_hours("2026-08-31-10:00", "2026-08-31-11:00", raise_on_error=False)
    assert result.success
    [check] = result.get_asset_check_evaluations()
    assert not check.passed and check.severity.value == "ERROR"
    assert "job 'broken'" in check.metadata["unplannable_jobs"].value
    assert [name for name, _ in queued(engine)] == ["fine", "fine"]


def test_a_cron_that_never_fires_is_refused_at_registration_naming_it(engine):
    for cron in ("0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *"):
        with pytest.raises(InvalidCron, match=re.escape(f"job 'never': cron '{cron}' never fires")):
            register_job(engine, "never", schedule=cron)
    register_job(engine, "leap-days", schedule="0 0 29 2 *")  # rare, but it fires


def evaluate(sensor_name, cursor=None):
    sensor = defs.resolve_sensor_def(sensor_name)
    with build_sensor_context(cursor=cursor, definitions=defs, resources=defs.resources,
                              instance=DagsterInstance.ephemeral()) as context:
        return sensor.evaluate_tick(context)


def test_the_live_sensor_requests_each_hour_again_only_when_the_jobs_change(engine):
    register_job(engine, "hourly", schedule="0 * * * *")
    first = evaluate("scheduled_runs_sensor").run_requests
    assert first and all(r.tags[LIVE_TAG] == "true" for r in first)
    assert [r.run_key for r in evaluate("scheduled_runs_sensor").run_requests] == [r.run_key for r in first]
    register_job(engine, "hourly", schedule="5 * * * *")
    changed = evaluate("scheduled_runs_sensor").run_requests
    assert {r.partition_key for r in changed} == {r.partition_key for r in first}
    assert not {r.run_key for r in changed} & {r.run_key for r in first}


def test_the_event_sensor_delivers_each_event_once_and_a_second_tick_writes_nothing(engine):
    register_job(engine, "mailer", event_type="ping")
    with engine.begin() as conn:
        conn.execute(insert(event), [{"type": "ping"}, {"type": "ping"}, {"type": "pong"}])
    assert evaluate("event_dispatch_sensor").skip_message == "delivered 3 events, queued 2 runs"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_queue")).scalar_one() == 2
    before = database_fingerprint(engine)
    assert evaluate("event_dispatch_sensor").skip_message == "delivered 0 events, queued 0 runs"
    assert database_fingerprint(engine) == before

@contextmanager
def listening(database_url):
    """A worker's ear: a session of its own that LISTENs on the channel workers wake on."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as listener:
        listener.execute("LISTEN rota_runs_queued")
        yield listener


def next_xid(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text)")).scalar_one())


def xids_taken_by(engine, action) -> int:
    """Transaction ids the server handed out while `action` ran. A NOTIFY takes its id at
    COMMIT, after every statement, so only the server's counter sees it, not
    pg_current_xact_id_if_assigned() inside the transaction. The server's own work (an
    autoanalyze) takes ids too: the fewest of up to three passes is the action's."""
    taken = []
    while len(taken) < 3 and 0 not in taken:
        before = next_xid(engine)
        action()
        taken.append(next_xid(engine) - before)
    return min(taken)


def _deliver_an_event(engine):
    register_job(engine, "mailer", event_type="ping")

    def deliver():
        assert "delivered" in evaluate("event_dispatch_sensor").skip_message
    with engine.begin() as conn:
        conn.execute(insert(event), {"type": "ping"})
    return deliver


def _deliver_an_hour(engine):
    register_job(engine, "hourly", schedule="0 * * * *")
    return lambda: materialize_hours("2026-08-31-10:00", "2026-08-31-10:00")


def _produce_a_ref(engine):
    register_job(engine, "nightly")
    return lambda: produce_many(engine, "maintenance", [("nightly/2026-08-31", "nightly", {"day": "2026-08-31"})])


@pytest.mark.parametrize("producer", [_deliver_an_event, _deliver_an_hour, _produce_a_ref])
def test_a_producer_with_nothing_new_wakes_no_worker_and_takes_no_transaction_id(database_url, engine, producer):
    """The event sensor ticks every 15 s, live delivery re-queues hours, Sources produce at
    every poll: a pass that queues nothing must not wake every worker (each then claims
    for nothing) nor take a transaction id (README: a no-op writes nothing)."""
    again = producer(engine)
    with listening(database_url) as listener:
        again()
        assert len(list(listener.notifies(timeout=10, stop_after=1))) == 1, "a pass that queues a run wakes workers"
        assert xids_taken_by(engine, again) == 0
        assert list(listener.notifies(timeout=1, stop_after=1)) == []


def runs_of(engine, name):
    with engine.connect() as conn:
        return {row.scheduled_for: row for row in conn.execute(text(
            "SELECT q.id, q.scheduled_for, q.state, q.attempts, q.last_error FROM job_queue q "
            "JOIN job j ON j.id = q.job_id WHERE j.name = :n"), {"n": name})}


def edit_by_hand(engine, name, schedule):
    with engine.begin() as conn:
        conn.execute(text("UPDATE job SET schedule = :s WHERE name = :n"), {"s": schedule, "n": name})


def edit_by_registering(engine, name, schedule):
    register_job(engine, name, schedule=schedule)


def live_hour(as_of):
    """What scheduled_runs_sensor does after a job changed: the hour delivered again, live."""
    return materialize_hours("2026-08-31-11:00", "2026-08-31-11:00", as_of=as_of, live=True)


def cron_edited_away_and_back(engine, edit):
    """The 11:00 fire time of an hourly job is queued; an operator moves the job to :30 at
    10:41 (11:00 is cancelled) and back to :00 at 10:43. Each edit is owed from when it was
    made, as its trigger records, in the test's clock."""
    register_job(engine, "report", schedule="0 * * * *")
    owed_since(engine, "report", "2026-08-31T10:00:00Z")
    assert live_hour("2026-08-31T10:40:00Z").success
    queued_at_first = runs_of(engine, "report")[utc(2026, 8, 31, 11)]
    for at, schedule in (("10:41", "30 * * * *"), ("10:43", "0 * * * *")):
        edit(engine, "report", schedule)
        owed_since(engine, "report", f"2026-08-31T{at}:00Z")
        assert live_hour(f"2026-08-31T{at}:30Z").success
    return queued_at_first


@pytest.mark.parametrize("edit", [edit_by_hand, edit_by_registering])
def test_a_fire_time_cancelled_by_a_cron_edit_and_owed_again_before_it_falls_due_runs_once(engine, edit):
    first = cron_edited_away_and_back(engine, edit)
    assert first.state == "queued"
    runs = runs_of(engine, "report")
    again = runs[utc(2026, 8, 31, 11)]
    assert (again.id, again.state, again.attempts, again.last_error) == (first.id, "queued", 0, None)
    assert runs[utc(2026, 8, 31, 11, 30)].state == "cancelled"
    assert [run.id for run in claim_due_runs(engine, "w1", 10, timedelta(seconds=30))] == [first.id]


def test_a_fire_time_cancelled_by_the_schedule_and_owed_again_is_missing_until_delivered(engine):
    """Edited back in time, but no delivery reached the hour before 11:00 fell out of the
    catch-up window: the run is owed and not queued, which the hour's check must say; a
    backfill of the hour queues it again."""
    register_job(engine, "report", schedule="0 * * * *")
    owed_since(engine, "report", "2026-08-31T10:00:00Z")
    assert live_hour("2026-08-31T10:40:00Z").success
    edit_by_hand(engine, "report", "30 * * * *")
    assert live_hour("2026-08-31T10:41:00Z").success
    edit_by_hand(engine, "report", "0 * * * *")
    owed_since(engine, "report", "2026-08-31T10:43:00Z")
    late = live_hour("2026-08-31T11:20:00Z").get_asset_check_evaluations()[0]
    assert (late.passed, late.metadata["missing"].value) == (False, 1)
    assert runs_of(engine, "report")[utc(2026, 8, 31, 11)].state == "cancelled"
    backfill = materialize_hours("2026-08-31-11:00", "2026-08-31-11:00", as_of="2026-08-31T11:20:00Z")
    assert backfill.get_asset_check_evaluations()[0].passed
    assert runs_of(engine, "report")[utc(2026, 8, 31, 11)].state == "queued"


def test_a_fire_time_an_operator_cancelled_stays_cancelled_when_delivered_again(engine):
    register_job(engine, "report", schedule="0 * * * *")
    owed_since(engine, "report", "2026-08-31T10:00:00Z")
    assert live_hour("2026-08-31T10:40:00Z").success
    run = runs_of(engine, "report")[utc(2026, 8, 31, 11)]
    operated = defs.resolve_job_def("operate_job_queue").execute_in_process(
        instance=DagsterInstance.ephemeral(), run_config={"ops": {"runs": {"config": {"retry": [], "cancel": [run.id]}}}})
    assert operated.success
    for delivery in (live_hour("2026-08-31T10:45:00Z"),
                     materialize_hours("2026-08-31-11:00", "2026-08-31-11:00", as_of="2026-08-31T10:45:00Z")):
        assert delivery.get_asset_check_evaluations()[0].passed, "the operator's cancel is no gap"
        assert runs_of(engine, "report")[utc(2026, 8, 31, 11)].state == "cancelled"


@pytest.mark.parametrize("edit", [edit_by_hand, edit_by_registering])
def test_a_fire_time_queued_again_wakes_the_workers(database_url, engine, edit):
    """A run queued again is an update, which job_queue_wakes_workers does not announce:
    the producer says it, or a due run would wait for a worker's next poll."""
    with listening(database_url) as listener:
        cron_edited_away_and_back(engine, edit)
        heard = list(listener.notifies(timeout=1, stop_after=10))
        assert len(heard) == 3, "11:00 queued, 11:30 queued, 11:00 queued again: each wakes the workers"


def test_a_schedules_cancel_compacted_past_retention_is_still_owed_again_and_an_operators_is_not(engine):
    """Compaction clears a finished run's error text; what cancelled the run must outlive
    it: the schedule's cancel is missing and queued again once the cron is undone, and an
    operator's cancel stays a decision, not a gap."""
    register_job(engine, "report", schedule="0 * * * *")
    owed_since(engine, "report", "2026-08-31T10:00:00Z")
    assert materialize_hours("2026-08-31-11:00", "2026-08-31-12:00", as_of="2026-08-31T10:40:00Z").success
    operator_cancelled = runs_of(engine, "report")[utc(2026, 8, 31, 12)]
    operated = defs.resolve_job_def("operate_job_queue").execute_in_process(
        instance=DagsterInstance.ephemeral(),
        run_config={"ops": {"runs": {"config": {"retry": [], "cancel": [operator_cancelled.id]}}}})
    assert operated.success
    edit_by_hand(engine, "report", "30 * * * *")
    assert live_hour("2026-08-31T10:41:00Z").success
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET finished_at = finished_at - interval '500 days'"))
    assert compact_finished_runs(engine, MaintenanceSettings(retention_days=450)) == 2
    edit_by_hand(engine, "report", "0 * * * *")
    owed_since(engine, "report", "2026-08-31T10:43:00Z")
    before = materialize_hours("2026-08-31-11:00", "2026-08-31-12:00", as_of="2026-08-31T10:44:00Z",
                               raise_on_error=False)
    runs = runs_of(engine, "report")
    assert (runs[utc(2026, 8, 31, 11)].state, runs[utc(2026, 8, 31, 12)].state) == ("queued", "cancelled")
    assert all(evaluation.passed for evaluation in before.get_asset_check_evaluations())
