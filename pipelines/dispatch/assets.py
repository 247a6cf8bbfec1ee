"""The five task assets: each materialisation dispatches its partitions' periods.

A thin shell: read the run's mode, instant and partition range, call the dispatcher
(which reads, plans and writes), report what it did: a materialization for each
partition complete as of the run's instant, and one completeness result for each."""

import warnings
from datetime import datetime, timezone
from typing import Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    Failure,
    MetadataValue,
    PreviewWarning,
    multi_asset,
)

from rota.pipelines.dispatch.completeness import FRESHNESS_CHECK, Gaps, find_gaps, stale_periods
from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.run import DispatchReport, dispatch, scheduled_reach
from rota.pipelines.dispatch.writing import MARKS_WAIT
from rota.pipelines.periods.as_of import AsOfConfig, run_instant
from rota.pipelines.periods.calendar import following, open_range, period_from_partition_key, periods_between
from rota.pipelines.periods.partitions import SINGLE_RUN, TASK_PARTITIONS, task_asset_name
from rota.resources.database.schema import FREQUENCIES
from rota.resources.postgres import PostgresResource

# A completeness result belongs to its partition, and only a partitioned check shows each
# partition's own status (an unpartitioned one shows whichever was written last). Dagster
# calls partitioned checks a preview; tests/dagster hold each 1.13 release rota accepts to them.
warnings.filterwarnings("ignore", category=PreviewWarning, message=".*partitions_def.*AssetCheckSpec.*")

# The run tag that makes a dispatch scheduled (SPEC §4): set by the schedules' run requests
# and by `rota dev`'s first dispatch; a run without it (a backfill, a "Materialize") is a
# backfill. Re-executions keep their run's tags, so a re-run tick stays scheduled.
MODE_TAG = "rota/mode"
COMPLETENESS_CHECK = "every_eligible_duty_has_one_task"


def _markdown(report: DispatchReport) -> str:
    outcomes = ("created", "existing", "held", "skipped", "outside_window")
    lines = ["| timezone | " + " | ".join(outcomes) + " |", "|---" * (len(outcomes) + 1) + "|"]
    for zone, counts in report.by_timezone().items():
        lines.append(f"| {zone} | " + " | ".join(str(counts.get(o, 0)) for o in outcomes) + " |")
    return "\n".join(lines)


def freshness_verdict(engine, frequency: str, log) -> dict:
    """The freshness check's result now, as keyword arguments of an AssetCheckResult."""
    gaps = stale_periods(engine, frequency, datetime.now(timezone.utc))
    if gaps.count:
        log.error("%s dispatch is behind: %s", frequency, gaps.describe())
    return dict(passed=not gaps.count, severity=AssetCheckSeverity.ERROR,
                description=gaps.describe() if gaps.count else None,
                metadata=_gap_metadata(gaps))


def build_task_asset(frequency: str) -> AssetsDefinition:
    name = task_asset_name(frequency)
    key = AssetKey(name)
    freshness = AssetCheckKey(key, FRESHNESS_CHECK)
    partitions = TASK_PARTITIONS[frequency]

    # One op for the asset and both its checks, each selectable alone (can_subset): the
    # dispatch jobs leave the freshness check out and the half-past job takes it alone,
    # and a backfill or "Materialize" that takes all three runs no step that could be
    # skipped behind an asset yielding no output.
    @multi_asset(
        name=name,
        specs=[AssetSpec(
            key, partitions_def=partitions, group_name="dispatch", kinds={"postgres"},
            description=f"Tasks of {frequency} duties, one per duty and period, dispatched exactly once. "
                        f"Partition key: the first day of the period ({PARTITION_KEY_NOTE[frequency]}).")],
        check_specs=[
            AssetCheckSpec(COMPLETENESS_CHECK, asset=key, partitions_def=partitions,
                           description="every duty owed a task of this period as of the run's instant has exactly "
                                       "one"),
            AssetCheckSpec(FRESHNESS_CHECK, asset=key,
                           description=f"Every eligible {frequency} duty has the task of the period it has been in "
                                       f"for an hour, in its own timezone."),
        ],
        can_subset=True,
        backfill_policy=SINGLE_RUN,
        # One dispatch run per frequency at a time where the instance limits pools (deploy/
        # dagster.yaml): overlapping runs would be correct, but would only wait on each other.
        pool=f"rota_dispatch_{frequency}",
    )
    def task_asset(context: AssetExecutionContext, config: AsOfConfig, database: PostgresResource):
        judged = AssetCheckKey(key, COMPLETENESS_CHECK) in context.selected_asset_check_keys
        if key in context.selected_asset_keys:
            yield from _dispatch_partitions(context, frequency, run_instant(config), database, judged)
        elif judged:
            yield from _judge_partitions(context, key, frequency, run_instant(config), database)
        if freshness in context.selected_asset_check_keys:
            verdict = freshness_verdict(database.engine(), frequency, context.log)
            if context.has_partition_key_range:
                # Dagster plans an unpartitioned check once per partition of a partitioned
                # run and shows each plan left unanswered as skipped: each gets the verdict.
                for partition_key in context.partition_keys:
                    yield AssetCheckEvaluation(asset_key=key, check_name=FRESHNESS_CHECK, partition=partition_key,
                                               **verdict)
            else:
                yield AssetCheckResult(asset_key=key, check_name=FRESHNESS_CHECK, **verdict)

    return task_asset


def _mode(context: AssetExecutionContext) -> Mode:
    return Mode.SCHEDULED if context.run.tags.get(MODE_TAG) == Mode.SCHEDULED.value else Mode.BACKFILL


def _run_periods(context: AssetExecutionContext, frequency: str) -> list:
    key_range = context.partition_key_range
    return periods_between(period_from_partition_key(frequency, key_range.start),
                           period_from_partition_key(frequency, key_range.end))


def _judge_partitions(context: AssetExecutionContext, key: AssetKey, frequency: str, as_of: datetime,
                      database: PostgresResource) -> Iterator:
    """The completeness check run alone (its "Execute" in the UI): the run's partitions, or
    the periods current somewhere when it has none, judged as of `as_of` without a write."""
    periods = _run_periods(context, frequency) if context.has_partition_key_range else \
        periods_between(*open_range(frequency, as_of, 0))
    gaps = find_gaps(database.engine(), frequency=frequency, mode=_mode(context), as_of=as_of, requested=periods,
                     parallel=database.dispatch_writers)
    for period in periods:
        yield _completeness(key, period, gaps.of_period(period.key))


def _completeness(key: AssetKey, period, own: Gaps) -> AssetCheckEvaluation:
    return AssetCheckEvaluation(
        asset_key=key, check_name=COMPLETENESS_CHECK, partition=period.partition_key,
        passed=not own.count and not own.held_count,
        # Tasks of held duties are missing for a known reason and made by a later run: a
        # warning, where a gap nobody can explain is an error.
        severity=AssetCheckSeverity.ERROR if own.count else AssetCheckSeverity.WARN,
        description=own.describe() if own.count or own.held_count else None,
        metadata=_gap_metadata(own))


def _dispatch_partitions(context: AssetExecutionContext, frequency: str, as_of: datetime,
                         database: PostgresResource, judged: bool) -> Iterator:
    """Dispatch the run's partitions (and a scheduled run's lead periods past them), then
    report each partition complete as of `as_of` as materialized, and judge each one when
    the run selected the completeness check."""
    mode = _mode(context)
    shown = _run_periods(context, frequency)
    requested = shown
    if mode is Mode.SCHEDULED:
        reach = scheduled_reach(database.engine(), frequency, as_of)
        if reach > shown[-1]:
            requested = shown + periods_between(following(shown[-1]), reach)
    report = dispatch(database.engine(), frequency=frequency, mode=mode, as_of=as_of,
                      requested=requested, writers=database.dispatch_writers)
    # From duty and task alone, not from what the run offered: a period the planner
    # never offered is a gap here too.
    gaps = find_gaps(database.engine(), frequency=frequency, mode=mode, as_of=as_of, requested=requested,
                     parallel=database.dispatch_writers, held=report.held)
    _log_report(context, report, gaps)
    if report.unplannable:
        listed = "; ".join(f"duty {d}: {why}" for d, why in sorted(report.unplannable.items()))
        raise Failure(
            description=f"{len(report.unplannable)} duties could not be planned "
                        f"(every other duty was dispatched): {listed}",
            metadata={"unplannable_duty_ids": sorted(report.unplannable)},
        )
    yield from _partitions_reported(context, shown, report, gaps, judged)
    ahead = {period.key: report.for_period(period.key) for period in requested[len(shown):]}
    if any(counts["created"] for counts in ahead.values()):
        # Periods that have begun nowhere have no partition; their tasks, made early for
        # a lead window, are reported on the asset itself.
        yield AssetObservation(asset_key=context.asset_key, metadata={
            "ahead": MetadataValue.json({k: c["created"] for k, c in ahead.items() if c["created"]}),
            "created_ahead": sum(c["created"] for c in ahead.values()), "as_of": as_of.isoformat()})


def _log_report(context: AssetExecutionContext, report: DispatchReport, gaps: Gaps) -> None:
    mode, name = report.mode, context.asset_key.to_user_string()
    if gaps.count:
        context.log.error("%s %s is incomplete: %s", mode.value, name, gaps.describe())
    if report.held:
        context.log.warning(
            "duties given no task this run, their rows locked by another transaction (SELECT … FOR UPDATE, an "
            "uncommitted DELETE or change of key): %d; the first run after that transaction ends makes their "
            "tasks: duty ids %s", len(report.held), _ids(report.held))
    if report.marks_deferred:
        context.log.info(
            "duties whose tasks were made but whose dispatch marks another transaction's lock kept back (an open "
            "UPDATE or FOR SHARE, or another run's page still writing after %d s): %d; a later run moves them: "
            "duty ids %s", MARKS_WAIT,
            len(report.marks_deferred), _ids(report.marks_deferred))
    context.log.info(
        "%s %s as of %s over %s..%s: %d duties read (a scheduled run skips those earlier runs left "
        "complete), created %d, existing %d, held %d, skipped %d, outside_window %d\n%s",
        mode.value, name, report.as_of.isoformat(), report.first_period, report.last_period, report.duties_read,
        report.total("created"), report.total("existing"), report.total("held"), report.total("skipped"),
        report.total("outside_window"), _markdown(report),
    )


def _partitions_reported(context: AssetExecutionContext, shown: list, report: DispatchReport, gaps: Gaps,
                         judged: bool) -> Iterator:
    """A materialization for each of the run's partitions complete as of its instant, and
    its completeness result when the run selected the check."""
    key, mode = context.asset_key, report.mode
    # An hourly scheduled run covers every period begun somewhere: reporting each again
    # would write unchanged materialisations every hour. It reports a period the first
    # time it is complete and whenever it made tasks for it.
    reported = context.instance.get_materialized_partitions(key) if mode is Mode.SCHEDULED else set()
    unchanged = 0
    for period in shown:
        counts = report.for_period(period.key)
        own = gaps.of_period(period.key)
        # A partition is materialized when every task owed as of `as_of` exists (none
        # may be owed yet); one with a gap stays as it was and its check says why.
        if not own.count and not own.held_count:
            if counts["created"] == 0 and period.partition_key in reported:
                unchanged += 1
            else:
                yield AssetMaterialization(
                    asset_key=key, partition=period.partition_key,
                    metadata={"period": period.key, "mode": mode.value, "as_of": report.as_of.isoformat(), **counts})
        if judged:
            yield _completeness(key, period, own)
    if unchanged:
        context.log.info("%d periods dispatched before and unchanged by this run: not reported again", unchanged)


def _gap_metadata(gaps: Gaps) -> dict:
    """How many are missing, and which first; the same of those waiting on a lock, when any."""
    metadata = {"missing": gaps.count}
    if gaps.count:
        metadata["first_missing"] = MetadataValue.json([list(pair) for pair in gaps.first])
    if gaps.held_count:
        metadata["waiting_on_a_lock"] = gaps.held_count
        metadata["first_waiting"] = MetadataValue.json([list(pair) for pair in gaps.held])
    return metadata


def _ids(duty_ids: set[int], shown: int = 50) -> str:
    listed = ", ".join(str(duty_id) for duty_id in sorted(duty_ids)[:shown])
    return listed + (f" and {len(duty_ids) - shown} more" if len(duty_ids) > shown else "")


PARTITION_KEY_NOTE = {
    "daily": "the day itself",
    "weekly": "the Monday of the ISO week",
    "monthly": "YYYY-MM-01",
    "quarterly": "YYYY-01-01, -04-01, -07-01 or -10-01",
    "yearly": "YYYY-01-01",
}


TASK_ASSETS = [build_task_asset(frequency) for frequency in FREQUENCIES]
