"""A run's instant is printed in its log and metadata: always in UTC, whatever offset its
`as_of` was written with."""

from datetime import datetime, timezone

import pytest
from dagster import Failure

from rota.pipelines.periods.as_of import AsOfConfig, run_instant


def test_an_as_of_written_with_an_offset_is_the_same_instant_in_utc():
    instant = run_instant(AsOfConfig(as_of="2026-08-31T22:30:00-03:30"))
    assert instant == datetime(2026, 9, 1, 2, 0, tzinfo=timezone.utc)
    assert instant.isoformat() == "2026-09-01T02:00:00+00:00"


def test_no_as_of_is_now_in_utc_and_a_bad_one_is_refused_by_name():
    assert run_instant(AsOfConfig()).utcoffset().total_seconds() == 0
    with pytest.raises(Failure, match="run config rejected"):
        run_instant(AsOfConfig(as_of="2026-08-31T22:30:00"))
