"""The five task assets: each materialisation dispatches its partitions' periods.

A thin shell: read the run's mode, instant and partition range, call the dispatcher
(which reads, plans and writes), report what it did."""

from datetime import datetime, timezone
from typing import Optional

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster._core.storage.tags import SCHEDULE_NAME_TAG

from pipelines.completeness import find_gaps
from pipelines.dispatch import DispatchReport, dispatch
from pipelines.partitions import SINGLE_RUN, TASK_PARTITIONS, task_asset_name
from pipelines.periods import parse_instant, period_from_partition_key, periods_between
from pipelines.planner import Mode
from pipelines.schema import FREQUENCIES
from resources.postgres import PostgresResource

COMPLETENESS_CHECK = "every_eligible_duty_has_one_task"


class AsOfConfig(Config):
    as_of: Optional[str] = None
    """ISO 8601 instant with a UTC offset. Default: the schedule's tick, or now."""


def run_instant(config: AsOfConfig) -> datetime:
    if config.as_of is None:
        return datetime.now(timezone.utc)
    try:
        return parse_instant(config.as_of)
    except ValueError as error:
        raise Failure(description=f"run config rejected: {error}") from None


def _markdown(report: DispatchReport) -> str:
    outcomes = ("created", "existing", "skipped", "outside_window")
    lines = ["| timezone | " + " | ".join(outcomes) + " |", "|---" * (len(outcomes) + 1) + "|"]
    for zone, counts in report.by_timezone().items():
        lines.append(f"| {zone} | " + " | ".join(str(counts.get(o, 0)) for o in outcomes) + " |")
    return "\n".join(lines)


def build_task_asset(frequency: str) -> AssetsDefinition:
    name = task_asset_name(frequency)

    @asset(
        name=name,
        partitions_def=TASK_PARTITIONS[frequency],
        backfill_policy=SINGLE_RUN,
        check_specs=[AssetCheckSpec(COMPLETENESS_CHECK, asset=name,
                                    description="every eligible duty has exactly one task per period")],
        group_name="dispatch",
        kinds={"postgres"},
        description=f"Tasks of {frequency} duties, one per duty and period, dispatched exactly once.",
    )
    def task_asset(context: AssetExecutionContext, config: AsOfConfig,
                   database: PostgresResource) -> MaterializeResult:
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
        gaps = find_gaps(database.engine(), frequency=frequency, mode=mode, as_of=as_of, requested=requested)
        if gaps.count:
            context.log.error("%s %s is incomplete: %s", mode.value, name, gaps.describe())
        context.log.info(
            "%s %s as of %s over %s..%s: created %d, existing %d, skipped %d",
            mode.value, name, as_of.isoformat(), report.first_period, report.last_period,
            report.total("created"), report.total("existing"), report.total("skipped"),
        )
        if report.unplannable:
            listed = "; ".join(f"duty {d}: {why}" for d, why in sorted(report.unplannable.items()))
            raise Failure(
                description=f"{len(report.unplannable)} duties could not be planned "
                            f"(every other duty was dispatched): {listed}",
                metadata={"unplannable_duty_ids": sorted(report.unplannable)},
            )
        return MaterializeResult(
            metadata={
                "frequency": frequency,
                "mode": mode.value,
                "as_of": as_of.isoformat(),
                "periods": f"{report.first_period}..{report.last_period}",
                "duties_read": report.duties_read,
                "created": report.total("created"),
                "existing": report.total("existing"),
                "skipped": report.total("skipped"),
                "outside_window": report.total("outside_window"),
                "deadlocks_retried": report.deadlocks_retried,
                "by_timezone": MetadataValue.md(_markdown(report)),
            },
            check_results=[
                AssetCheckResult(
                    check_name=COMPLETENESS_CHECK,
                    passed=not gaps.count,
                    severity=AssetCheckSeverity.ERROR,
                    description=gaps.describe() if gaps.count else None,
                    metadata={
                        "missing": gaps.count,
                        "first_missing": MetadataValue.json([list(pair) for pair in gaps.first]),
                    },
                )
            ],
        )

    return task_asset


TASK_ASSETS = [build_task_asset(frequency) for frequency in FREQUENCIES]
