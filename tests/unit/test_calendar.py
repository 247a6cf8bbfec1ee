"""A period key, as the calendar makes it (no database): every key matches its
frequency's pattern and no other's, and one frequency's keys sort as their periods do."""

import re
from datetime import date, timedelta

import pytest

from rota.pipelines.periods.calendar import CALENDARS, period_containing
from rota.resources.database.schema import FREQUENCIES

# 1998 to 2040 holds ISO years of 53 weeks and years whose 1 January lies in the previous
# ISO year, and every leap-day case up to 2040.
DAYS = [date(1998, 1, 1) + timedelta(days=n) for n in range(0, (date(2041, 1, 1) - date(1998, 1, 1)).days, 3)]


@pytest.mark.parametrize("frequency", FREQUENCIES)
def test_every_key_matches_its_frequencys_pattern_and_no_other(frequency):
    periods = sorted({period_containing(frequency, day) for day in DAYS})
    for period in periods:
        matching = [f for f in FREQUENCIES if re.fullmatch(CALENDARS[f].key_pattern, period.key)]
        assert matching == [frequency], (period, matching)
    assert [p.key for p in periods] == sorted(p.key for p in periods)


def test_the_calendars_cover_every_frequency_the_schema_allows():
    assert sorted(CALENDARS) == sorted(FREQUENCIES)
