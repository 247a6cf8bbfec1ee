"""One dispatch schedule per task asset (one job cannot mix partitions definitions).

Each tick requests exactly one run over one partition range: every period current
anywhere on Earth at the tick. The run dispatches, beyond that range, the periods the
largest active `lead_days` reaches (no partition shows them: they have begun nowhere).
The run gets the tick as its `as_of` and the scheduled mode as a tag, so a re-execution
stays a scheduled run as of the original tick."""

from datetime import datetime

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    define_asset_job,
    schedule,
)

from rota.pipelines.dispatch.assets import MODE_TAG
from rota.pipelines.dispatch.completeness import FRESHNESS_CHECK
from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.periods.calendar import open_range, period_from_partition_key
from rota.pipelines.periods.partitions import (
    DISPATCH_CRON,
    PARTITION_RANGE_END_TAG,
    PARTITION_RANGE_START_TAG,
    TASK_PARTITIONS,
    task_asset_name,
)
from rota.resources.database.schema import FREQUENCIES


def build_dispatch_job(frequency: str):
    """A named job per task asset, so the runs list names what each run dispatches. The
    freshness check is not part of it: the half-past job runs it (schedules/freshness.py)."""
    asset_name = task_asset_name(frequency)
    selection = AssetSelection.assets(asset_name) - AssetSelection.checks(AssetCheckKey(AssetKey(asset_name),
                                                                                         FRESHNESS_CHECK))
    return define_asset_job(f"dispatch_{frequency}_tasks", selection=selection,
                            description=f"Dispatches the {frequency} tasks of the selected periods.")


DISPATCH_JOBS = {frequency: build_dispatch_job(frequency) for frequency in FREQUENCIES}


def scheduled_run_request(frequency: str, tick: datetime) -> RunRequest:
    """The run a tick owes: scheduled, as of the tick, over the periods current at it."""
    asset_name = task_asset_name(frequency)
    first, last = open_range(frequency, tick, 0)
    # A tick just before the history start (`rota dev`'s first dispatch) may still see a
    # period that lies before the first partition; nothing there is shown or owed.
    history = period_from_partition_key(frequency, TASK_PARTITIONS[frequency].get_first_partition_key())
    first = max(first, history)
    return RunRequest(
        run_key=f"{asset_name}@{tick.isoformat()}",
        run_config={"ops": {asset_name: {"config": {"as_of": tick.isoformat()}}}},
        tags={
            PARTITION_RANGE_START_TAG: first.partition_key,
            PARTITION_RANGE_END_TAG: last.partition_key,
            MODE_TAG: Mode.SCHEDULED.value,
        },
    )


def build_dispatch_schedule(frequency: str) -> ScheduleDefinition:
    asset_name = task_asset_name(frequency)

    @schedule(
        name=f"{asset_name}_schedule",
        cron_schedule=DISPATCH_CRON,
        execution_timezone="UTC",
        job=DISPATCH_JOBS[frequency],
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Dispatches every open {frequency} period, in every duty's own timezone.",
    )
    def dispatch_schedule(context: ScheduleEvaluationContext):
        return scheduled_run_request(frequency, context.scheduled_execution_time)

    return dispatch_schedule


DISPATCH_SCHEDULES = [build_dispatch_schedule(frequency) for frequency in FREQUENCIES]
