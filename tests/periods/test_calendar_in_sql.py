"""The period arithmetic the queries do, held to the calendar's: for every day of several
years, SQL's period start, key and due date (from calendar_units' parameters) are the
planner's, and the task partitions' function places every key in a partition that holds it."""

import pytest
from sqlalchemy import text

from rota.pipelines.periods.calendar import calendar_units, period_containing
from rota.resources.database.schema import FREQUENCIES

FIRST, LAST = "2019-12-20", "2027-01-10"  # ISO years 2020 and 2026 have 53 weeks

IN_SQL = text("""
    SELECT d::date, to_char(date_trunc(:unit, d), :key_format),
           CAST(date_trunc(:unit, d) AS date),
           CAST(date_trunc(:unit, d) + CAST(:step AS interval) - interval '1 day' AS date),
           p.lower_bound, p.upper_bound
    FROM generate_series(CAST(:first AS timestamp), CAST(:last AS timestamp), interval '1 day') AS d
    CROSS JOIN LATERAL rota_task_partition_of(to_char(date_trunc(:unit, d), :key_format)) AS p
    ORDER BY 1
""")


@pytest.mark.parametrize("frequency", FREQUENCIES)
def test_sql_makes_the_calendars_periods_and_partitions_hold_their_keys(engine, frequency):
    with engine.connect() as conn:
        rows = conn.execute(IN_SQL, {**calendar_units(frequency), "first": FIRST, "last": LAST}).all()
    assert len(rows) > 2500
    for day, key, start, end, lower, upper in rows:
        period = period_containing(frequency, day)
        assert (key, start, end) == (period.key, period.start, period.end), day
        assert lower <= key < upper, (key, lower, upper)
