"""The one place each task asset's partitions are defined (keys as SPEC §3).

Partitions reach far enough ahead for the longest lead window (366 days) in the
easternmost zone (UTC+14): `end_offset` counts periods past the last complete one."""

import os
import warnings
from datetime import datetime

from dagster import (
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    MonthlyPartitionsDefinition,
    TimeWindowPartitionsDefinition,
    WeeklyPartitionsDefinition,
)

from pipelines.schema import FREQUENCIES

# Single-run backfills are what make a selected range one run; Dagster still labels the
# parameter beta and would warn once per asset at every code-location load.
warnings.filterwarnings("ignore", category=BetaWarning, message=".*backfill_policy.*")
SINGLE_RUN = BackfillPolicy.single_run()

TASK_PARTITIONS = {
    "daily": DailyPartitionsDefinition(start_date="2020-01-01", end_offset=369),
    # ISO weeks start on Monday; 2019-12-30 is the Monday of 2020-W01.
    "weekly": WeeklyPartitionsDefinition(start_date="2019-12-30", day_offset=1, end_offset=55),
    "monthly": MonthlyPartitionsDefinition(start_date="2020-01-01", end_offset=15),
    "quarterly": TimeWindowPartitionsDefinition(
        cron_schedule="0 0 1 */3 *", start="2020-01-01", fmt="%Y-%m-%d", end_offset=7
    ),
    "yearly": TimeWindowPartitionsDefinition(
        cron_schedule="0 0 1 1 *", start="2020-01-01", fmt="%Y-%m-%d", end_offset=4
    ),
}
assert tuple(TASK_PARTITIONS) == FREQUENCIES


def task_asset_name(frequency: str) -> str:
    return f"{frequency}_tasks"


def queue_history_start() -> datetime:
    """Where the queue's partitions (hours of fire times, maintenance nights) begin:
    ROTA_HISTORY_START (UTC, `2026-12-03` or `2026-12-03T09:00`), when rota's history
    starts (`rota dev` records the hour of its first start under ROTA_HOME). Nothing
    before it was ever delivered, so a partition there would only show as missing; set it
    earlier to backfill further back."""
    value = os.environ.get("ROTA_HISTORY_START", "2025-01-01")
    try:
        start = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"ROTA_HISTORY_START must be a UTC date or hour like 2026-12-03 or 2026-12-03T09:00, "
                         f"not {value!r}") from None
    return start.replace(minute=0, second=0, microsecond=0, tzinfo=None)
