"""Freshness checks on the task assets: an operator hears when dispatch stops.

Each task asset has the check `current_period_dispatched`, run every hour at half past by
`freshness_checks_schedule`: every eligible duty has the task of the period it has been in
for an hour, in its own zone (the scheduled-run rules as of an hour ago, checked from
`duty` and `task` alone). A daemon that stopped ticking, a failing dispatch run or a
schedule switched off all show here within the hour as a failed check naming duties and
periods, whatever the runs themselves say.

The check is one of the task asset's own (`pipelines.dispatch.assets`), selectable alone:
this job runs it without dispatching, the dispatch jobs leave it out."""

from dagster import AssetCheckKey, AssetKey, AssetSelection, DefaultScheduleStatus, ScheduleDefinition, \
    define_asset_job

from rota.pipelines.dispatch.completeness import FRESHNESS_CHECK
from rota.pipelines.periods.partitions import task_asset_name
from rota.resources.database.schema import FREQUENCIES

freshness_checks_job = define_asset_job(
    "freshness_checks",
    selection=AssetSelection.checks(*(AssetCheckKey(AssetKey(task_asset_name(frequency)), FRESHNESS_CHECK)
                                      for frequency in FREQUENCIES)),
    description="Checks that every eligible duty has its current period's task.")
freshness_checks_schedule = ScheduleDefinition(
    name="freshness_checks_schedule", job=freshness_checks_job, cron_schedule="30 * * * *",
    execution_timezone="UTC", default_status=DefaultScheduleStatus.RUNNING,
    description="Every hour at half past: the task assets' freshness checks.")
