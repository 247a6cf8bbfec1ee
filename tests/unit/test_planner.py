"""The pure planner and period arithmetic: SPEC §3–4 pinned without a database."""

from datetime import date, datetime, timezone

import pytest

from rota.pipelines.dispatch.planner import Mode, plan
from rota.pipelines.periods.calendar import (
    open_range,
    parse_instant,
    period_containing,
    period_from_partition_key,
    periods_between,
)
from tests.helpers import duty_row, planned_tasks


def at(text: str) -> datetime:
    return parse_instant(text)


def scheduled_keys(duties, as_of, frequency="monthly", span=("2020-01-01", "2030-01-01")):
    requested = periods_between(period_containing(frequency, date.fromisoformat(span[0])),
                                period_containing(frequency, date.fromisoformat(span[1])))
    result = plan(duties, frequency=frequency, mode=Mode.SCHEDULED, as_of=at(as_of), requested=requested)
    keys: dict[int, list[str]] = {}
    for row in planned_tasks(result):
        keys.setdefault(row.duty_id, []).append(row.period_key)
    return keys


@pytest.mark.parametrize("frequency, day, key, start, end", [
    ("daily", "2026-08-31", "2026-08-31", "2026-08-31", "2026-08-31"),
    ("weekly", "2026-08-30", "2026-W35", "2026-08-24", "2026-08-30"),
    ("weekly", "2026-12-31", "2026-W53", "2026-12-28", "2027-01-03"),
    ("weekly", "2027-01-03", "2026-W53", "2026-12-28", "2027-01-03"),
    ("weekly", "2027-01-04", "2027-W01", "2027-01-04", "2027-01-10"),
    ("weekly", "2021-01-03", "2020-W53", "2020-12-28", "2021-01-03"),
    ("monthly", "2028-02-29", "2028-02", "2028-02-01", "2028-02-29"),
    ("monthly", "2027-02-14", "2027-02", "2027-02-01", "2027-02-28"),
    ("quarterly", "2026-08-31", "2026-Q3", "2026-07-01", "2026-09-30"),
    ("quarterly", "2026-12-31", "2026-Q4", "2026-10-01", "2026-12-31"),
    ("yearly", "2028-02-29", "2028", "2028-01-01", "2028-12-31"),
])
def test_period_keys_and_bounds(frequency, day, key, start, end):
    period = period_containing(frequency, date.fromisoformat(day))
    assert (period.key, period.start.isoformat(), period.end.isoformat()) == (key, start, end)
    assert period_from_partition_key(frequency, period.partition_key) == period


def test_keys_are_fixed_width_so_lexical_order_is_chronological():
    for frequency in ("daily", "weekly", "monthly", "quarterly", "yearly"):
        periods = periods_between(period_containing(frequency, date(2020, 1, 1)),
                                  period_containing(frequency, date(2031, 12, 31)))
        keys = [p.key for p in periods]
        assert keys == sorted(keys) and len(set(map(len, keys))) == 1, frequency


def test_a_partition_key_that_is_not_a_period_start_is_refused():
    with pytest.raises(ValueError, match="not the first day of a period"):
        period_from_partition_key("weekly", "2026-08-25")
    with pytest.raises(ValueError, match="not a YYYY-MM-DD date"):
        period_from_partition_key("monthly", "2026-08")


def test_as_of_without_an_offset_is_refused():
    with pytest.raises(ValueError, match="has no UTC offset"):
        parse_instant("2026-08-31T20:00:00")
    with pytest.raises(ValueError, match="not an ISO 8601 instant"):
        parse_instant("last tuesday")


def test_shanghai_and_los_angeles_get_different_months_in_one_run():
    duties = [duty_row(1, timezone="Asia/Shanghai"), duty_row(2, timezone="America/Los_Angeles")]
    assert scheduled_keys(duties, "2026-08-31T20:00:00Z") == {1: ["2026-09"], 2: ["2026-08"]}


def test_zero_lead_duty_still_gets_its_current_period():
    assert scheduled_keys([duty_row(1, lead_days=0)], "2026-08-15T00:00:00Z") == {1: ["2026-08"]}


def test_later_periods_appear_once_their_lead_window_opens():
    duties = [duty_row(1, lead_days=10), duty_row(2, lead_days=45), duty_row(3, lead_days=366, frequency="daily")]
    keys = scheduled_keys(duties[:2], "2026-08-21T12:00:00Z")
    assert keys == {1: ["2026-08"], 2: ["2026-08", "2026-09"]}
    daily = scheduled_keys([duties[2]], "2026-08-21T12:00:00Z", frequency="daily")[3]
    assert daily[0] == "2026-08-21" and daily[-1] == "2027-08-22" and len(daily) == 367


@pytest.mark.parametrize("zone, instant, key", [
    ("Pacific/Kiritimati", "2026-08-31T09:59:00Z", "2026-08-31"),   # UTC+14
    ("Pacific/Kiritimati", "2026-08-31T10:00:00Z", "2026-09-01"),
    ("Pacific/Pago_Pago", "2026-09-01T10:59:00Z", "2026-08-31"),    # UTC-11
    ("Pacific/Pago_Pago", "2026-09-01T11:00:00Z", "2026-09-01"),
    ("Asia/Kathmandu", "2026-08-31T18:14:00Z", "2026-08-31"),       # UTC+5:45
    ("Asia/Kathmandu", "2026-08-31T18:15:00Z", "2026-09-01"),
    ("Pacific/Chatham", "2026-08-31T11:14:00Z", "2026-08-31"),      # UTC+12:45 in winter
    ("Pacific/Chatham", "2026-08-31T11:15:00Z", "2026-09-01"),
    ("Pacific/Chatham", "2026-12-31T10:14:00Z", "2026-12-31"),      # UTC+13:45 in summer
    ("Pacific/Chatham", "2026-12-31T10:15:00Z", "2027-01-01"),
    # Europe/London springs forward at 01:00Z on 2026-03-29 and falls back on 2026-10-25.
    ("Europe/London", "2026-03-28T23:59:00Z", "2026-03-28"),
    ("Europe/London", "2026-03-29T00:00:00Z", "2026-03-29"),
    ("Europe/London", "2026-03-29T23:00:00Z", "2026-03-30"),
    ("Europe/London", "2026-10-24T22:59:00Z", "2026-10-24"),
    ("Europe/London", "2026-10-24T23:00:00Z", "2026-10-25"),
    ("Europe/London", "2026-10-26T00:00:00Z", "2026-10-26"),
    # America/New_York springs forward at 07:00Z on 2026-03-08 and falls back on 2026-11-01.
    ("America/New_York", "2026-03-08T04:59:00Z", "2026-03-07"),
    ("America/New_York", "2026-03-08T05:00:00Z", "2026-03-08"),
    ("America/New_York", "2026-03-09T04:00:00Z", "2026-03-09"),
    ("America/New_York", "2026-11-01T03:59:00Z", "2026-10-31"),
    ("America/New_York", "2026-11-01T04:00:00Z", "2026-11-01"),
    ("America/New_York", "2026-11-02T05:00:00Z", "2026-11-02"),
    # 29 February, in the zone where it begins first.
    ("Pacific/Kiritimati", "2028-02-28T10:00:00Z", "2028-02-29"),
])
def test_local_day_boundaries(zone, instant, key):
    assert scheduled_keys([duty_row(1, timezone=zone, frequency="daily")], instant, frequency="daily") == {1: [key]}


def test_leap_day_yearly_and_daily():
    duties = [duty_row(1, frequency="yearly", lead_days=0)]
    assert scheduled_keys(duties, "2028-02-29T12:00:00Z", frequency="yearly") == {1: ["2028"]}
    row = planned_tasks(plan(duties, frequency="yearly", mode=Mode.SCHEDULED, as_of=at("2028-02-29T12:00:00Z"),
                             requested=[period_containing("yearly", date(2028, 1, 1))]))[0]
    assert (row.period_start, row.due_date, row.visible_from) == (date(2028, 1, 1), date(2028, 12, 31), date(2028, 12, 31))


def test_standing_paused_and_archived_duties_produce_nothing_in_either_mode():
    duties = [duty_row(1, kind="standing"), duty_row(2, state="paused"), duty_row(3, state="archived")]
    requested = periods_between(period_containing("monthly", date(2026, 1, 1)),
                                period_containing("monthly", date(2026, 8, 1)))
    for mode in Mode:
        result = plan(duties, frequency="monthly", mode=mode, as_of=at("2026-08-31T20:00:00Z"), requested=requested)
        assert planned_tasks(result) == [] and not result.counts


def test_duty_level_window_applies_to_scheduled_runs_only():
    closed = duty_row(1, effective_from=date(2026, 1, 1), effective_to=date(2026, 6, 30))
    assert scheduled_keys([closed], "2026-08-31T12:00:00Z") == {}
    requested = periods_between(period_containing("monthly", date(2025, 12, 1)),
                                period_containing("monthly", date(2026, 8, 1)))
    result = plan([closed], frequency="monthly", mode=Mode.BACKFILL, as_of=at("2026-08-31T12:00:00Z"),
                  requested=requested)
    assert [t.period_key for t in planned_tasks(result)] == [f"2026-0{m}" for m in range(1, 7)]
    assert result.counts[("UTC", "outside_window")] == 3


def test_period_level_window_uses_the_due_date():
    ends_mid_month = duty_row(1, effective_to=date(2026, 8, 15))
    assert scheduled_keys([ends_mid_month], "2026-08-10T12:00:00Z") == {}
    starts_mid_month = duty_row(2, effective_from=date(2026, 8, 15))
    assert scheduled_keys([starts_mid_month], "2026-08-20T12:00:00Z") == {2: ["2026-08"]}


def test_backfill_never_goes_beyond_what_a_scheduled_run_would_create():
    requested = periods_between(period_containing("monthly", date(2026, 7, 1)),
                                period_containing("monthly", date(2026, 10, 1)))
    duties = [duty_row(1, lead_days=0), duty_row(2, lead_days=45)]
    result = plan(duties, frequency="monthly", mode=Mode.BACKFILL, as_of=at("2026-08-21T12:00:00Z"),
                  requested=requested)
    assert [(t.duty_id, t.period_key) for t in planned_tasks(result)] == [
        (1, "2026-07"), (1, "2026-08"), (2, "2026-07"), (2, "2026-08"), (2, "2026-09")]
    assert result.counts[("UTC", "skipped")] == 3


@pytest.mark.parametrize("marks, after", [
    ((None, None), True),
    (("2026-06", None), True),
    (("2026-06", "2026-07"), False),  # its first task, 2026-07, is not after the mark
    (("2026-06", "2026-09"), False),  # a later backfill moved the mark past periods still to make
])
def test_a_plan_is_after_the_dispatched_marks_only_when_every_duty_starts_past_its_own(marks, after):
    """after_dispatched chooses the writer's path and nothing else: the tasks are the same."""
    requested = periods_between(period_containing("monthly", date(2026, 7, 1)),
                                period_containing("monthly", date(2026, 8, 1)))
    duties = [duty_row(1), duty_row(2, lead_days=45)]
    marked = [d._replace(last_dispatched_period=mark) for d, mark in zip(duties, marks)]
    unmarked = plan(duties, frequency="monthly", mode=Mode.BACKFILL, as_of=at("2026-08-21T12:00:00Z"),
                    requested=requested)
    result = plan(marked, frequency="monthly", mode=Mode.BACKFILL, as_of=at("2026-08-21T12:00:00Z"),
                  requested=requested)
    assert result.after_dispatched is after
    assert planned_tasks(result) == planned_tasks(unmarked) and result.counts == unmarked.counts


def test_an_unknown_zone_is_reported_by_duty_and_does_not_stop_the_others():
    duties = [duty_row(1, timezone="Mars/Olympus_Mons"), duty_row(2)]
    result = plan(duties, frequency="monthly", mode=Mode.SCHEDULED, as_of=at("2026-08-31T12:00:00Z"),
                  requested=[period_containing("monthly", date(2026, 8, 1))])
    assert list(result.unplannable) == [1] and "Mars/Olympus_Mons" in result.unplannable[1]
    assert [t.duty_id for t in planned_tasks(result)] == [2]


def test_open_range_covers_every_zone_and_the_longest_lead():
    first, last = open_range("daily", datetime(2026, 8, 31, 20, tzinfo=timezone.utc), 0)
    assert (first.key, last.key) == ("2026-08-31", "2026-09-01")
    first, last = open_range("monthly", datetime(2026, 8, 31, 9, tzinfo=timezone.utc), 40)
    assert (first.key, last.key) == ("2026-08", "2026-10")
