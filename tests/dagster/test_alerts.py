"""An operator hears when dispatch stops: freshness checks on the task assets, and a
run-failure sensor that posts to a webhook (a local HTTP server here)."""

import json
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, build_run_status_sensor_context, materialize
from sqlalchemy import select, update

from rota.pipelines.dispatch.assets import MODE_TAG
from rota.pipelines.definitions import defs
from rota.pipelines.dispatch.completeness import find_gaps
from rota.pipelines.dispatch.completeness import FRESHNESS_CHECK, stale_periods
from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.periods.calendar import open_range, parse_instant, periods_between
from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from rota.resources.alerts import AlertWebhookResource
from rota.resources.database.schema import duty
from rota.schedules.alerts import run_failure_alert_sensor
from tests.helpers import add_duty, tenant


def _scheduled(engine, frequency, at):
    dispatch(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=at,
             requested=periods_between(*open_range(frequency, at, 0)))


def test_a_period_not_dispatched_an_hour_after_it_opened_fails_the_freshness_check(engine):
    kiritimati = add_duty(engine, frequency="daily", timezone="Pacific/Kiritimati")
    honolulu = add_duty(engine, frequency="daily", timezone="Pacific/Honolulu")
    # 10:30 UTC: Kiritimati (UTC+14) has been in 2026-12-04 since 10:00, for half an hour.
    now = parse_instant("2026-12-03T10:30:00Z")
    gaps = stale_periods(engine, "daily", now)
    assert gaps.first == [(kiritimati, "2026-12-03"), (honolulu, "2026-12-02")]
    _scheduled(engine, "daily", now - timedelta(hours=1))
    assert stale_periods(engine, "daily", now).count == 0
    # 11:30 UTC with no tick since: Kiritimati has been in 12-04 for ninety minutes, Honolulu
    # (UTC-10) in 12-03 likewise, and neither has its task.
    later = parse_instant("2026-12-03T11:30:00Z")
    assert stale_periods(engine, "daily", later).first == [(kiritimati, "2026-12-04"), (honolulu, "2026-12-03")]


def test_a_duty_that_became_eligible_after_the_tick_is_judged_from_then(engine, database_url):
    """Created, unpaused or re-windowed after 10:00: neither check fails at 10:30 (nothing
    is behind); both judge it from the next tick. Its eligible_since is the database's."""
    now = datetime.now(timezone.utc)
    tick = now.replace(minute=0, second=0, microsecond=0)
    created = add_duty(engine, frequency="daily", timezone="UTC", eligible_since=None)
    paused = add_duty(engine, frequency="daily", timezone="UTC", state="paused")
    windowed = add_duty(engine, frequency="daily", timezone="UTC", effective_to=tick.date() - timedelta(days=3))
    with engine.begin() as conn:
        conn.execute(update(duty).where(duty.c.id == paused).values(state="active"))
        conn.execute(update(duty).where(duty.c.id == windowed).values(effective_to=None))
        since = dict(conn.execute(select(duty.c.id, duty.c.eligible_since)).all())
    assert all(since[d] >= now for d in (created, paused, windowed))
    current = periods_between(*open_range("daily", tick, 0))
    assert find_gaps(engine, frequency="daily", mode=Mode.SCHEDULED, as_of=tick,
                     requested=current).count == 0
    assert stale_periods(engine, "daily", now).count == 0
    # From the instant it became eligible, a missing task is a gap again.
    later = max(since.values()) + timedelta(hours=1)
    assert {d for d, _ in stale_periods(engine, "daily", later + timedelta(hours=1)).first} == \
        {created, paused, windowed}


def test_a_tenant_cannot_move_a_duty_out_of_the_checks_sight(engine, database_url, workspace):
    duty_id = add_duty(engine, workspace_id=workspace, frequency="daily")
    with tenant(database_url, workspace) as conn:
        for statement in ("UPDATE duty SET eligible_since = 'infinity' WHERE id = %s",
                          "INSERT INTO duty (workspace_id, title, kind, frequency, timezone, eligible_since) "
                          "SELECT workspace_id, 'x', 'recurring', 'daily', 'UTC', 'infinity' FROM duty WHERE id = %s"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(statement, (duty_id,))
            conn.rollback()


def test_the_freshness_checks_run_as_a_job_and_name_what_is_missing(engine):
    duty_id = add_duty(engine, frequency="monthly", timezone="UTC")
    job = defs.resolve_job_def("freshness_checks")
    result = job.execute_in_process(instance=DagsterInstance.ephemeral())
    evaluations = {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {(f"{f}_tasks", FRESHNESS_CHECK)
                                for f in ("daily", "weekly", "monthly", "quarterly", "yearly")}
    failed = evaluations[("monthly_tasks", FRESHNESS_CHECK)]
    assert not failed.passed and f"duty {duty_id} has no task for" in failed.description
    now = datetime.now(timezone.utc)
    for at in (now - timedelta(hours=1), now):
        _scheduled(engine, "monthly", at)
    result = job.execute_in_process(instance=DagsterInstance.ephemeral())
    assert all(e.passed for e in result.get_asset_check_evaluations())


def _latest_freshness(instance, asset):
    key = AssetCheckKey(AssetKey(asset), FRESHNESS_CHECK)
    return instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)


def test_the_freshness_check_shows_its_last_real_result_whatever_else_runs(engine):
    """Dagster plans every check of the assets a backfill or a "Materialize" selects, and
    records one whose step was skipped as "Skipped": the asset evaluates it there instead,
    and the hourly dispatch runs never plan it."""
    instance = DagsterInstance.ephemeral()
    duty_id = add_duty(engine, frequency="monthly", timezone="UTC")
    defs.resolve_job_def("freshness_checks").execute_in_process(instance=instance)
    checked = _latest_freshness(instance, "monthly_tasks")
    assert checked.status.value == "FAILED"
    assert f"duty {duty_id} has no task for" in checked.event.dagster_event.event_specific_data.description

    now = datetime.now(timezone.utc)
    first, last = open_range("monthly", now - timedelta(days=40), 0)[0], open_range("monthly", now, 0)[1]
    tags = {PARTITION_RANGE_START_TAG: first.partition_key, PARTITION_RANGE_END_TAG: last.partition_key}
    backfill = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance, asset_selection=[AssetKey("monthly_tasks")], tags=tags)
    evaluated = _latest_freshness(instance, "monthly_tasks")
    assert (evaluated.run_id, evaluated.status.value) == (backfill.run_id, "SUCCEEDED")

    scheduled = defs.resolve_job_def("dispatch_monthly_tasks").execute_in_process(
        instance=instance, tags={**tags, MODE_TAG: "scheduled"})
    assert scheduled.success
    assert _latest_freshness(instance, "monthly_tasks").run_id == backfill.run_id


class _Webhook:
    def __init__(self):
        self.received = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def webhook():
    hook = _Webhook()
    yield hook
    hook.server.shutdown()
    hook.server.server_close()


def _failed_run(engine):
    from sqlalchemy import text

    with engine.begin() as conn:  # a zone PostgreSQL knows but Python does not: the run fails loudly
        conn.execute(text("INSERT INTO iana_timezone VALUES ('Mars/Olympus_Mons')"))
    add_duty(engine, timezone="Mars/Olympus_Mons")
    instance = DagsterInstance.ephemeral()
    result = materialize([defs.resolve_assets_def("monthly_tasks")], instance=instance, raise_on_error=False,
                         tags={PARTITION_RANGE_START_TAG: "2026-08-01", PARTITION_RANGE_END_TAG: "2026-08-01"},
                         run_config={"ops": {"monthly_tasks": {"config": {"as_of": "2026-08-20T00:00:00Z"}}}})
    assert not result.success
    return instance, result


def test_a_failed_run_is_posted_to_the_configured_webhook(engine, webhook):
    instance, result = _failed_run(engine)
    context = build_run_status_sensor_context(
        sensor_name="run_failure_alert_sensor", dagster_instance=instance, dagster_run=result.dagster_run,
        dagster_event=result.get_run_failure_event(), resources={"alerts": AlertWebhookResource(url=webhook.url)},
    ).for_run_failure()
    run_failure_alert_sensor(context)
    [message] = webhook.received
    assert message["run_id"] == result.run_id and message["partition_range"] == ["2026-08-01", "2026-08-01"]
    assert "failed" in message["text"] and message["job"] == result.dagster_run.job_name


def test_without_a_webhook_nothing_is_posted(engine, webhook):
    instance, result = _failed_run(engine)
    context = build_run_status_sensor_context(
        sensor_name="run_failure_alert_sensor", dagster_instance=instance, dagster_run=result.dagster_run,
        dagster_event=result.get_run_failure_event(), resources={"alerts": AlertWebhookResource()},
    ).for_run_failure()
    run_failure_alert_sensor(context)
    assert webhook.received == []
