"""Freshness checks on the task assets: an operator hears when dispatch stops.

Each task asset has the check `current_period_dispatched`, run every hour at half past by
`freshness_checks_schedule`: every eligible duty has the task of the period it has been in
for an hour, in its own zone (the scheduled-run rules as of an hour ago, checked from
`duty` and `task` alone). A daemon that stopped ticking, a failing dispatch run or a
schedule switched off all show here within the hour as a failed check naming duties and
periods, whatever the runs themselves say.

The dispatch jobs leave the check out. A backfill or a "Materialize" of a task asset
plans it (Dagster adds every check of the selected assets), and the asset evaluates it
there (`pipelines.dispatch.assets.freshness_verdict`): otherwise Dagster would record it skipped
behind an asset that yields no output, and "Skipped" would hide its last result."""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetSelection,
    DefaultScheduleStatus,
    ScheduleDefinition,
    asset_check,
    define_asset_job,
)

from rota.pipelines.dispatch.assets import freshness_verdict
from rota.pipelines.dispatch.completeness import FRESHNESS_CHECK
from rota.pipelines.periods.partitions import task_asset_name
from rota.resources.database.schema import FREQUENCIES
from rota.resources.postgres import PostgresResource


def build_freshness_check(frequency: str) -> AssetChecksDefinition:
    @asset_check(asset=task_asset_name(frequency), name=FRESHNESS_CHECK, blocking=False,
                 description=f"Every eligible {frequency} duty has the task of the period it has been in "
                             f"for an hour, in its own timezone.")
    def freshness(context: AssetCheckExecutionContext, database: PostgresResource) -> AssetCheckResult:
        return AssetCheckResult(**freshness_verdict(database.engine(), frequency, context.log))

    return freshness


FRESHNESS_CHECKS = [build_freshness_check(frequency) for frequency in FREQUENCIES]
freshness_checks_job = define_asset_job(
    "freshness_checks", selection=AssetSelection.checks(*FRESHNESS_CHECKS),
    description="Checks that every eligible duty has its current period's task.")
freshness_checks_schedule = ScheduleDefinition(
    name="freshness_checks_schedule", job=freshness_checks_job, cron_schedule="30 * * * *",
    execution_timezone="UTC", default_status=DefaultScheduleStatus.RUNNING,
    description="Every hour at half past: the task assets' freshness checks.")
