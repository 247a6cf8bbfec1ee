"""Where the first partition lies for a history start: the partitions against the scheduled runs' reach."""

import random
from datetime import datetime, timedelta, timezone

import pytest

from rota.pipelines.periods.calendar import open_range
from rota.pipelines.periods.partitions import first_dispatch_tick, first_task_partition
from rota.resources.database.schema import FREQUENCIES


@pytest.mark.parametrize("start, first_daily", [
    ("2026-12-04T20:38:00+00:00", "2026-12-04"),  # first tick 21:00Z: 09:00 on the 4th at UTC-12
    ("2026-12-04T02:10:00+00:00", "2026-12-03"),  # first tick 03:00Z: 15:00 on the 3rd at UTC-12
    ("2026-12-04T12:00:00+00:00", "2026-12-04"),  # a tick itself: midnight of the 4th at UTC-12
])
def test_the_first_partition_is_the_first_period_the_first_scheduled_run_reaches(start, first_daily):
    assert first_task_partition("daily", datetime.fromisoformat(start)) == first_daily


def test_no_scheduled_run_after_the_start_reaches_before_the_first_partition_and_the_first_does():
    rng = random.Random(25)
    for _ in range(300):
        start = datetime(2020, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=rng.randrange(60 * 24 * 365 * 8))
        tick = first_dispatch_tick(start)
        assert start <= tick < start + timedelta(hours=1)
        for frequency in FREQUENCIES:
            first = first_task_partition(frequency, start)
            assert open_range(frequency, tick, 0)[0].partition_key == first
            later = tick + timedelta(hours=rng.randrange(1, 24 * 400))
            assert open_range(frequency, later, 0)[0].partition_key >= first
