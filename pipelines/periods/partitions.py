"""The one place each asset's partitions are defined (task keys as SPEC §3).

Every partitions definition begins where rota's history starts (`pipelines.periods.history`):
a fresh install shows no period from before it existed as missing. The task assets begin
at the history start, which an operator may move back to backfill; the queue's and
maintenance's at the install, which nothing moves. Task partitions end
at the period that has begun somewhere on Earth: the one current in the easternmost
zone (UTC+14), which is where the definitions' clock is kept. No partition lies in the
future of every zone, so none is shown missing that nothing owes yet; the tasks a lead
window makes ahead of that are a scheduled run's own, reported in its metadata
(docs/operating.md, "Task partitions")."""

import warnings
from datetime import datetime, timedelta

from croniter import croniter
from dagster import (
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    HourlyPartitionsDefinition,
    MonthlyPartitionsDefinition,
    TimeWindowPartitionsDefinition,
    WeeklyPartitionsDefinition,
)

from rota.pipelines.periods.calendar import LATEST_UTC_OFFSET, open_range
from rota.pipelines.periods.history import history_start, installed_at
from rota.resources.database.schema import FREQUENCIES
from rota.resources.scheduling import dispatch_schedule_from_env

# Single-run backfills are what make a selected range one run; Dagster still labels the
# parameter beta and would warn once per asset at every code-location load.
warnings.filterwarnings("ignore", category=BetaWarning, message=".*backfill_policy.*")
SINGLE_RUN = BackfillPolicy.single_run()
# The run tags that make one run cover a partition range, as Dagster's single-run backfills
# tag theirs; a schedule's run request sets them the same way. Dagster exports no public
# name for them (1.13), so the strings live here only, held equal to Dagster's own by
# tests/unit/test_public_dagster.py.
PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"

DISPATCH_CRON = dispatch_schedule_from_env().cron


def first_dispatch_tick(start: datetime) -> datetime:
    """The first scheduled dispatch at or after `start` (the schedules tick in UTC)."""
    return croniter(DISPATCH_CRON, start - timedelta(microseconds=1)).get_next(datetime)


def first_task_partition(frequency: str, start: datetime) -> str:
    """The first period the first scheduled run after `start` dispatches: the period current
    in the zone furthest behind UTC at that tick. Nothing before it was ever due under rota."""
    return open_range(frequency, first_dispatch_tick(start), 0)[0].partition_key


# The zone whose clock opens each period first (POSIX names count west positive).
EASTERNMOST = "Etc/GMT-14"
assert LATEST_UTC_OFFSET == timedelta(hours=14)


def _task_partitions(start: datetime) -> dict:
    first = {frequency: first_task_partition(frequency, start) for frequency in FREQUENCIES}
    # end_offset=1: the period in progress in that zone, one past the last one complete.
    return {
        "daily": DailyPartitionsDefinition(start_date=first["daily"], timezone=EASTERNMOST, end_offset=1),
        # ISO weeks start on Monday: partition keys are the Mondays.
        "weekly": WeeklyPartitionsDefinition(start_date=first["weekly"], day_offset=1, timezone=EASTERNMOST,
                                             end_offset=1),
        "monthly": MonthlyPartitionsDefinition(start_date=first["monthly"], timezone=EASTERNMOST, end_offset=1),
        "quarterly": TimeWindowPartitionsDefinition(
            cron_schedule="0 0 1 */3 *", start=first["quarterly"], fmt="%Y-%m-%d", timezone=EASTERNMOST, end_offset=1
        ),
        "yearly": TimeWindowPartitionsDefinition(
            cron_schedule="0 0 1 1 *", start=first["yearly"], fmt="%Y-%m-%d", timezone=EASTERNMOST, end_offset=1
        ),
    }


HISTORY_START = history_start()
TASK_PARTITIONS = _task_partitions(HISTORY_START)
assert tuple(TASK_PARTITIONS) == FREQUENCIES
# The queue's hours of fire times, and its maintenance nights (UTC), from the install: a
# history start moved back to backfill tasks owes no fire time and no night before it.
INSTALLED_AT = installed_at()
HOURLY = HourlyPartitionsDefinition(start_date=INSTALLED_AT.strftime("%Y-%m-%d-%H:00"), end_offset=2)
NIGHTLY_PARTITIONS = DailyPartitionsDefinition(start_date=INSTALLED_AT.date().isoformat())


def task_asset_name(frequency: str) -> str:
    return f"{frequency}_tasks"
