"""The five task assets: each materialisation dispatches its partitions' periods.

A thin shell: read the run's mode, instant and partition range, call the dispatcher
(which reads, plans and writes), report what it did."""

from datetime import datetime, timezone

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AssetMaterialization,
    AssetObservation,
    Failure,
    MetadataValue,
    asset,
)
from dagster._core.storage.tags import SCHEDULE_NAME_TAG

from rota.pipelines.dispatch.completeness import FRESHNESS_CHECK, Gaps, find_gaps, stale_periods
from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.run import DispatchReport, dispatch
from rota.pipelines.periods.as_of import AsOfConfig, run_instant
from rota.pipelines.periods.calendar import period_from_partition_key, periods_between
from rota.pipelines.periods.partitions import SINGLE_RUN, TASK_PARTITIONS, task_asset_name
from rota.resources.database.schema import FREQUENCIES
from rota.resources.postgres import PostgresResource

COMPLETENESS_CHECK = "every_eligible_duty_has_one_task"


def _markdown(report: DispatchReport) -> str:
    outcomes = ("created", "existing", "held", "skipped", "outside_window")
    lines = ["| timezone | " + " | ".join(outcomes) + " |", "|---" * (len(outcomes) + 1) + "|"]
    for zone, counts in report.by_timezone().items():
        lines.append(f"| {zone} | " + " | ".join(str(counts.get(o, 0)) for o in outcomes) + " |")
    return "\n".join(lines)


def dispatched(counts: dict[str, int]) -> bool:
    """A period counts as dispatched when its tasks exist, or when nothing was due for it
    because no duty was eligible; a period entirely beyond what a scheduled run at the
    run's instant would create (only skips) was not dispatched."""
    return counts["created"] + counts["existing"] > 0 or counts["skipped"] == 0


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

    @asset(
        name=name,
        partitions_def=TASK_PARTITIONS[frequency],
        backfill_policy=SINGLE_RUN,
        # Materialisations are reported per partition, and only for periods dispatched:
        # Dagster would otherwise mark every partition of the run's range materialized.
        output_required=False,
        check_specs=[AssetCheckSpec(COMPLETENESS_CHECK, asset=name,
                                    description="every eligible duty has exactly one task per period")],
        group_name="dispatch",
        # One dispatch run per frequency at a time where the instance limits pools (deploy/
        # dagster.yaml): overlapping runs would be correct, but would only wait on each other.
        pool=f"rota_dispatch_{frequency}",
        kinds={"postgres"},
        description=f"Tasks of {frequency} duties, one per duty and period, dispatched exactly once. "
                    f"Partition key: the first day of the period ({PARTITION_KEY_NOTE[frequency]}).",
    )
    def task_asset(context: AssetExecutionContext, config: AsOfConfig, database: PostgresResource):
        as_of = run_instant(config)
        mode = Mode.SCHEDULED if SCHEDULE_NAME_TAG in context.run.tags else Mode.BACKFILL
        key_range = context.partition_key_range
        requested = periods_between(
            period_from_partition_key(frequency, key_range.start),
            period_from_partition_key(frequency, key_range.end),
        )
        report = dispatch(database.engine(), frequency=frequency, mode=mode, as_of=as_of,
                          requested=requested, writers=database.dispatch_writers)
        # From duty and task alone, not from what the run offered: a period the planner
        # never offered is a gap here too.
        gaps = find_gaps(database.engine(), frequency=frequency, mode=mode, as_of=as_of, requested=requested,
                         parallel=database.dispatch_writers, held=report.held)
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
                "UPDATE, FOR SHARE): %d; a later run moves them: duty ids %s",
                len(report.marks_deferred), _ids(report.marks_deferred))
        context.log.info(
            "%s %s as of %s over %s..%s: %d duties read (a scheduled run skips those earlier runs left "
            "complete), created %d, existing %d, held %d, skipped %d, outside_window %d\n%s",
            mode.value, name, as_of.isoformat(), report.first_period, report.last_period, report.duties_read,
            report.total("created"), report.total("existing"), report.total("held"), report.total("skipped"),
            report.total("outside_window"), _markdown(report),
        )
        if report.unplannable:
            listed = "; ".join(f"duty {d}: {why}" for d, why in sorted(report.unplannable.items()))
            raise Failure(
                description=f"{len(report.unplannable)} duties could not be planned "
                            f"(every other duty was dispatched): {listed}",
                metadata={"unplannable_duty_ids": sorted(report.unplannable)},
            )
        # An hourly scheduled run covers every open period up to the largest lead: reporting
        # each again would write millions of unchanged materialisations a year. It reports a
        # period the first time it is dispatched and whenever it made tasks for it.
        reported = context.instance.get_materialized_partitions(context.asset_key) if mode is Mode.SCHEDULED \
            else set()
        beyond, unchanged = [], 0
        for period in requested:
            counts = report.for_period(period.key)
            if not dispatched(counts):
                beyond.append(period.key)
                if mode is Mode.BACKFILL:
                    # Dagster has no status for a partition a run rightly left alone: its
                    # backfill counts it failed. The partition itself says why.
                    yield AssetObservation(asset_key=context.asset_key, partition=period.partition_key, metadata={
                        "not_dispatched": NOT_YET, "period": period.key, "as_of": as_of.isoformat(), **counts})
                continue
            if counts["created"] == 0 and period.partition_key in reported:
                unchanged += 1
                continue
            yield AssetMaterialization(
                asset_key=context.asset_key, partition=period.partition_key,
                metadata={"period": period.key, "mode": mode.value, "as_of": as_of.isoformat(), **counts},
            )
        if beyond and mode is Mode.BACKFILL:
            context.log.info("not dispatched, beyond what a scheduled run as of %s creates: %s",
                             as_of.isoformat(), ", ".join(beyond))
        elif beyond:
            # Duties whose tasks earlier runs made are not read again: these periods may
            # well hold theirs, so the run claims nothing about them beyond what it read.
            context.log.info("not reached by any duty this run read (duties that earlier runs left complete "
                             "are not read again): %s", ", ".join(beyond))
        if unchanged:
            context.log.info("%d periods dispatched before and unchanged by this run: not reported again", unchanged)
        # A run that plans the freshness check (a backfill, a "Materialize") gets its result
        # here: its own step is skipped behind an asset that yields no output.
        freshness = AssetCheckKey(context.asset_key, FRESHNESS_CHECK)
        if freshness in context.job_def.asset_layer.asset_graph.asset_check_keys:
            context.log_event(AssetCheckEvaluation(asset_key=context.asset_key, check_name=FRESHNESS_CHECK,
                                                   **freshness_verdict(database.engine(), frequency, context.log)))
        # Tasks of held duties are missing for a known reason and made by a later run: a
        # warning, where a gap nobody can explain is an error.
        yield AssetCheckResult(
            check_name=COMPLETENESS_CHECK,
            passed=not gaps.count and not gaps.held_count,
            severity=AssetCheckSeverity.ERROR if gaps.count else AssetCheckSeverity.WARN,
            description=gaps.describe() if gaps.count or gaps.held_count else None,
            metadata=_gap_metadata(gaps),
        )

    return task_asset


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


NOT_YET = ("beyond what a scheduled run creates at as_of: no duty has reached this period's start or its "
           "visible_from (due date minus lead_days) in its own timezone yet. The hourly schedule creates its "
           "tasks when one does; nothing is missing.")

PARTITION_KEY_NOTE = {
    "daily": "the day itself",
    "weekly": "the Monday of the ISO week",
    "monthly": "YYYY-MM-01",
    "quarterly": "YYYY-01-01, -04-01, -07-01 or -10-01",
    "yearly": "YYYY-01-01",
}


TASK_ASSETS = [build_task_asset(frequency) for frequency in FREQUENCIES]
