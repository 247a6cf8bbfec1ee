"""Freshness checks on the task assets: an operator hears when dispatch stops.

Each task asset has the check `current_period_dispatched`, run every hour at half past by
`freshness_checks_schedule`: every eligible duty has the task of the period it has been in
for an hour, in its own zone (the scheduled-run rules as of an hour ago, checked from
`duty` and `task` alone). A daemon that stopped ticking, a failing dispatch run or a
schedule switched off all show here within the hour as a failed check naming duties and
periods, whatever the runs themselves say."""

from datetime import datetime, timedelta, timezone

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetChecksDefinition,
    AssetSelection,
    DefaultScheduleStatus,
    MetadataValue,
    ScheduleDefinition,
    asset_check,
    define_asset_job,
)

from pipelines.completeness import Gaps, find_gaps
from pipelines.partitions import task_asset_name
from pipelines.periods import open_range, periods_between
from pipelines.planner import Mode
from pipelines.schema import FREQUENCIES
from resources.postgres import PostgresResource

FRESHNESS_CHECK = "current_period_dispatched"
GRACE = timedelta(hours=1)


def stale_periods(engine, frequency: str, now: datetime) -> Gaps:
    """Eligible duties without the task of the period they have been in for GRACE."""
    as_of = now - GRACE
    return find_gaps(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=as_of,
                     requested=periods_between(*open_range(frequency, as_of, 0)))


def build_freshness_check(frequency: str) -> AssetChecksDefinition:
    @asset_check(asset=task_asset_name(frequency), name=FRESHNESS_CHECK, blocking=False,
                 description=f"Every eligible {frequency} duty has the task of the period it has been in "
                             f"for an hour, in its own timezone.")
    def freshness(context: AssetCheckExecutionContext, database: PostgresResource) -> AssetCheckResult:
        gaps = stale_periods(database.engine(), frequency, datetime.now(timezone.utc))
        if gaps.count:
            context.log.error("%s dispatch is behind: %s", frequency, gaps.describe())
        return AssetCheckResult(
            passed=not gaps.count, severity=AssetCheckSeverity.ERROR,
            description=gaps.describe() if gaps.count else None,
            metadata={"missing": gaps.count, "first_missing": MetadataValue.json([list(p) for p in gaps.first])},
        )

    return freshness


FRESHNESS_CHECKS = [build_freshness_check(frequency) for frequency in FREQUENCIES]
freshness_checks_job = define_asset_job(
    "freshness_checks", selection=AssetSelection.checks(*FRESHNESS_CHECKS),
    description="Checks that every eligible duty has its current period's task.")
freshness_checks_schedule = ScheduleDefinition(
    name="freshness_checks_schedule", job=freshness_checks_job, cron_schedule="30 * * * *",
    execution_timezone="UTC", default_status=DefaultScheduleStatus.RUNNING,
    description="Every hour at half past: the task assets' freshness checks.")
