"""The Dagster surface: Definitions load, assets over partition ranges, schedules."""

from datetime import date, datetime, timedelta, timezone

from dagster import AssetCheckKey, AssetKey, AssetSelection, DagsterInstance, build_schedule_context, materialize
from sqlalchemy import text

from rota.pipelines.definitions import defs
from rota.pipelines.dispatch.assets import COMPLETENESS_CHECK, MODE_TAG
from rota.pipelines.dispatch.completeness import FRESHNESS_CHECK
from rota.pipelines.periods.calendar import open_range, parse_instant, periods_between
from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG, TASK_PARTITIONS
from rota.resources.database.schema import FREQUENCIES
from tests.helpers import add_duty, database_fingerprint, keys_by_duty, task_keys


def run_asset(name, first, last, as_of=None, tags=None, raise_on_error=True, freshness=False):
    """A run of one task asset over a partition range, as a backfill's run (as a scheduled
    one with the mode tag); with its completeness check, and its freshness check if asked."""
    run_config = {"ops": {name: {"config": {"as_of": as_of}}}} if as_of else None
    return materialize(
        [defs.resolve_assets_def(name)],
        selection=_selection(name, freshness),
        instance=DagsterInstance.ephemeral(),
        tags={PARTITION_RANGE_START_TAG: first, PARTITION_RANGE_END_TAG: last, **(tags or {})},
        run_config=run_config,
        raise_on_error=raise_on_error,
    )


def _selection(name, freshness=False):
    """The asset and its completeness check, as a dispatch job takes them; with the
    freshness check too, as a backfill or "Materialize" does."""
    selection = AssetSelection.assets(name)
    if freshness:
        return selection
    return selection - AssetSelection.checks(AssetCheckKey(AssetKey(name), FRESHNESS_CHECK))


def metadata(result, name):
    materialization = result.asset_materializations_for_node(name)[0]
    return {key: value.value for key, value in materialization.metadata.items()}


def by_partition(result, name):
    """Each materialized partition's own metadata."""
    return {m.partition: {key: value.value for key, value in m.metadata.items()}
            for m in result.asset_materializations_for_node(name)}


def test_a_thirteen_month_backfill_is_one_run_and_a_second_inserts_nothing(engine):
    plain = add_duty(engine, timezone="Asia/Kathmandu")
    closed = add_duty(engine, effective_from=date(2025, 3, 1), effective_to=date(2025, 10, 31))
    result = run_asset("monthly_tasks", "2025-08-01", "2026-10-01", as_of="2026-08-20T00:00:00+02:00")
    assert result.success
    assert keys_by_duty(engine) == {
        plain: [f"{y}-{m:02d}" for y, m in [(2025, m) for m in range(8, 13)] + [(2026, m) for m in range(1, 9)]],
        closed: ["2025-08", "2025-09", "2025-10"],
    }
    # One materialization per period complete as of the run, each counting its own period;
    # 2026-09 and 2026-10 lie beyond what a run as of 2026-08-20 creates: nothing was owed
    # yet, and they say so (skipped).
    partitions = by_partition(result, "monthly_tasks")
    months = [f"{y}-{m:02d}-01" for y, m in [(2025, m) for m in range(8, 13)] + [(2026, m) for m in range(1, 11)]]
    assert sorted(partitions) == months
    outcomes = ("created", "existing", "skipped", "outside_window")
    assert [partitions["2025-10-01"][o] for o in outcomes] == [2, 0, 0, 0]
    assert [partitions["2025-11-01"][o] for o in outcomes] == [1, 0, 0, 1]
    assert [partitions["2026-09-01"][o] for o in outcomes] == [0, 0, 2, 0]
    assert partitions["2026-08-01"]["mode"] == "backfill"
    # One completeness result per partition, each its own: none left planned and skipped.
    checks = result.get_asset_check_evaluations()
    assert sorted((c.check_name, c.partition, c.passed) for c in checks) == [
        (COMPLETENESS_CHECK, month, True) for month in months]
    before = database_fingerprint(engine)
    again = by_partition(run_asset("monthly_tasks", "2025-08-01", "2026-10-01", as_of="2026-08-20T00:00:00+02:00"),
                         "monthly_tasks")
    assert sorted(again) == sorted(partitions)
    assert [again["2025-10-01"][o] for o in outcomes] == [0, 2, 0, 0]
    assert database_fingerprint(engine) == before


def test_a_range_beyond_the_runs_instant_is_materialized_as_owing_nothing_yet(engine):
    """A backfill's partition is done when every task owed as of the run exists, none
    owed included: the backfill closes succeeded, and the counts say nothing was due."""
    add_duty(engine, timezone="UTC", lead_days=40)
    result = run_asset("monthly_tasks", "2027-01-01", "2027-03-01", as_of="2026-12-25T12:00:00Z")
    assert result.success
    partitions = by_partition(result, "monthly_tasks")
    assert sorted(partitions) == ["2027-01-01", "2027-02-01", "2027-03-01"]
    assert partitions["2027-01-01"]["created"] == 1  # visible_from 2026-12-22
    assert (partitions["2027-02-01"]["created"], partitions["2027-02-01"]["skipped"]) == (0, 1)
    assert task_keys(engine) == ["2027-01"]


def test_an_as_of_without_an_offset_fails_the_run_before_any_write(engine):
    add_duty(engine)
    result = run_asset("monthly_tasks", "2026-08-01", "2026-08-01", as_of="2026-08-20T00:00:00",
                       raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert "has no UTC offset" in failure.message or "has no UTC offset" in str(failure.cause)
    assert task_keys(engine) == []


def test_an_unplannable_duty_fails_the_run_by_id_after_the_rest_is_written(engine):
    with engine.begin() as conn:  # a zone PostgreSQL knows but Python does not
        conn.execute(text("INSERT INTO iana_timezone VALUES ('Mars/Olympus_Mons')"))
    good = add_duty(engine)
    bad = add_duty(engine, timezone="Mars/Olympus_Mons")
    result = run_asset("monthly_tasks", "2026-08-01", "2026-08-01", as_of="2026-08-20T00:00:00Z",
                       raise_on_error=False)
    assert not result.success
    message = str(result.get_step_failure_events()[0].step_failure_data.error)
    assert f"duty {bad}" in message and "Mars/Olympus_Mons" in message
    assert keys_by_duty(engine) == {good: ["2026-08"]}


def scheduled_run(frequency, tick, instance=None):
    schedule = defs.resolve_schedule_def(f"{frequency}_tasks_schedule")
    with build_schedule_context(scheduled_execution_time=tick, resources=defs.resources) as context:
        requests = schedule.evaluate_tick(context).run_requests
    assert len(requests) == 1
    request = requests[0]
    assert request.tags[MODE_TAG] == "scheduled"
    result = materialize(
        [defs.resolve_assets_def(f"{frequency}_tasks")],
        selection=_selection(f"{frequency}_tasks"),
        instance=instance or DagsterInstance.ephemeral(),
        tags=request.tags,
        run_config=request.run_config,
    )
    return request, result


def test_a_schedule_tick_is_one_scheduled_run_as_of_the_tick(engine):
    shanghai = add_duty(engine, timezone="Asia/Shanghai")
    los_angeles = add_duty(engine, timezone="America/Los_Angeles", lead_days=30)
    add_duty(engine, timezone="UTC", state="paused", lead_days=300)
    tick = parse_instant("2026-08-31T20:00:00Z")
    request, result = scheduled_run("monthly", tick)
    # The months begun somewhere on Earth at the tick (September in UTC+14): the lead's
    # later months are dispatched without a partition.
    assert (request.tags[PARTITION_RANGE_START_TAG], request.tags[PARTITION_RANGE_END_TAG]) == (
        "2026-08-01", "2026-09-01")
    assert metadata(result, "monthly_tasks")["mode"] == "scheduled"
    assert metadata(result, "monthly_tasks")["as_of"] == tick.isoformat()
    assert keys_by_duty(engine) == {shanghai: ["2026-09"], los_angeles: ["2026-08", "2026-09"]}


def test_an_hourly_run_reports_only_periods_it_changed_or_never_reported(engine):
    """The event log grows with new work, not with hours: a scheduled run reports each
    period begun somewhere once, then only the ones it made tasks for; the tasks a lead
    makes for periods begun nowhere are reported on the asset, never as a partition."""
    add_duty(engine, frequency="daily", timezone="UTC", lead_days=300)
    instance = DagsterInstance.ephemeral()
    tick = parse_instant("2026-08-31T09:00:00Z")
    _, first = scheduled_run("daily", tick, instance)
    # 2026-08-30 is still open west of UTC; 2026-09-01 has begun nowhere yet.
    assert sorted(by_partition(first, "daily_tasks")) == ["2026-08-30", "2026-08-31"]
    [ahead] = first.asset_observations_for_node("daily_tasks")
    assert ahead.metadata["created_ahead"].value == 300 and "2027-06-27" in ahead.metadata["ahead"].value
    _, unchanged = scheduled_run("daily", tick + timedelta(minutes=20), instance)
    assert by_partition(unchanged, "daily_tasks") == {}
    assert unchanged.asset_observations_for_node("daily_tasks") == []
    add_duty(engine, frequency="daily", timezone="UTC", lead_days=2)
    _, changed = scheduled_run("daily", tick + timedelta(minutes=40), instance)
    assert sorted(by_partition(changed, "daily_tasks")) == ["2026-08-31"]
    [ahead] = changed.asset_observations_for_node("daily_tasks")
    assert sorted(ahead.metadata["ahead"].value) == ["2026-09-01", "2026-09-02"]
    assert instance.get_materialized_partitions(defs.resolve_assets_def("daily_tasks").key) == {
        "2026-08-30", "2026-08-31"}


def test_a_scheduled_run_fills_no_gap_where_a_backfill_would(engine):
    duty_id = add_duty(engine, frequency="daily", timezone="Pacific/Kiritimati")
    scheduled_run("daily", parse_instant("2026-08-31T09:00:00Z"))
    scheduled_run("daily", parse_instant("2026-09-03T09:00:00Z"))
    assert task_keys(engine, duty_id) == ["2026-08-31", "2026-09-03"]
    run_asset("daily_tasks", "2026-08-31", "2026-09-04", as_of="2026-09-03T09:00:00Z")
    assert task_keys(engine, duty_id) == ["2026-08-31", "2026-09-01", "2026-09-02", "2026-09-03"]


def test_rota_devs_start_up_dispatch_is_the_last_ticks_scheduled_run_saying_who_started_it(engine, tmp_path,
                                                                                           monkeypatch):
    """Its materializations say `mode: scheduled` because it dispatches by the scheduled
    rules, as the daemon would have at the tick (a backfill of the same range would fill
    the day before and make nothing ahead); its runs say `rota dev` started them, and claim
    no schedule's tick."""
    from rota.pipelines.cli.dev import STARTED_BY_TAG, dispatch_once

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    duty_id = add_duty(engine, frequency="daily", timezone="UTC", lead_days=3)
    assert dispatch_once(parse_instant("2026-08-31T09:30:00Z")) == 4
    assert task_keys(engine, duty_id) == ["2026-08-31", "2026-09-01", "2026-09-02", "2026-09-03"]
    with DagsterInstance.get() as instance:
        runs = instance.get_runs()
        assert len(runs) == len(FREQUENCIES)
        assert all(run.tags[STARTED_BY_TAG] == "rota dev" and "dagster/schedule_name" not in run.tags
                   and run.tags[MODE_TAG] == "scheduled" for run in runs)
        [daily] = [run for run in runs if run.job_name == "dispatch_daily_tasks"]
        materialized = [record.asset_materialization for record in instance.fetch_materializations(
            AssetKey("daily_tasks"), limit=10).records if record.run_id == daily.run_id]
    assert materialized and all(m.metadata["mode"].value == "scheduled" for m in materialized)


def test_every_frequency_schedule_runs(engine):
    ids = {f: add_duty(engine, frequency=f, timezone="Pacific/Chatham", lead_days=3) for f in FREQUENCIES}
    tick = datetime(2026, 12, 31, 11, tzinfo=timezone.utc) - timedelta(minutes=0)
    for frequency in FREQUENCIES:
        scheduled_run(frequency, tick)
    assert keys_by_duty(engine) == {
        ids["daily"]: ["2027-01-01", "2027-01-02", "2027-01-03", "2027-01-04"],
        ids["weekly"]: ["2026-W53"],
        ids["monthly"]: ["2027-01"],
        ids["quarterly"]: ["2027-Q1"],
        ids["yearly"]: ["2027"],
    }




def test_a_week_of_hourly_ticks_leaves_no_partition_it_shows_missing(engine):
    """Every daily partition that has begun somewhere by a tick is materialized by that
    tick's run, whoever owes it yet: a day that only Kiritimati has reached shows done,
    owing nothing, and the run that later makes its tasks reports it again."""
    for zone, lead in (("Europe/Berlin", 0), ("America/Los_Angeles", 2), ("Asia/Tokyo", 0)):
        add_duty(engine, frequency="daily", timezone=zone, lead_days=lead)
    instance = DagsterInstance.ephemeral()
    first_tick = parse_instant("2026-11-02T00:00:00Z")
    first = open_range("daily", first_tick, 0)[0]
    for hour in range(7 * 24):
        tick = first_tick + timedelta(hours=hour)
        scheduled_run("daily", tick, instance)
        # What the catalog shows at the tick: the partitions definition's keys then.
        shown = {key for key in TASK_PARTITIONS["daily"].get_partition_keys(current_time=tick)
                 if key >= first.partition_key}
        assert shown == {p.partition_key for p in periods_between(first, open_range("daily", tick, 0)[1])}
        materialized = instance.get_materialized_partitions(defs.resolve_assets_def("daily_tasks").key)
        assert materialized == shown, (tick, sorted(shown - materialized))


def test_the_completeness_check_run_alone_judges_each_partition_and_writes_nothing(engine):
    """The check's own "Execute": each partition of the run judged from duty and task as
    of now, nothing dispatched, nothing left planned."""
    duty_id = add_duty(engine, frequency="monthly", timezone="UTC")
    name = "monthly_tasks"
    check = AssetSelection.checks(AssetCheckKey(AssetKey(name), COMPLETENESS_CHECK))
    result = materialize([defs.resolve_assets_def(name)], selection=check, instance=DagsterInstance.ephemeral(),
                         tags={PARTITION_RANGE_START_TAG: "2026-08-01", PARTITION_RANGE_END_TAG: "2026-09-01"})
    assert result.success and task_keys(engine) == []
    assert result.asset_materializations_for_node(name) == []
    evaluations = {e.partition: e for e in result.get_asset_check_evaluations()}
    assert sorted(evaluations) == ["2026-08-01", "2026-09-01"]
    assert not evaluations["2026-08-01"].passed
    assert evaluations["2026-08-01"].metadata["first_missing"].value == [[duty_id, "2026-08"]]
    run_asset(name, "2026-08-01", "2026-09-01")
    again = materialize([defs.resolve_assets_def(name)], selection=check, instance=DagsterInstance.ephemeral(),
                        tags={PARTITION_RANGE_START_TAG: "2026-08-01", PARTITION_RANGE_END_TAG: "2026-09-01"})
    assert all(e.passed for e in again.get_asset_check_evaluations())
