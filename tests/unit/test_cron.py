"""Cron fire times, with the daylight-saving policy pinned, and the hours live delivery queues ahead."""

from datetime import datetime, timedelta, timezone

import pytest

from rota.pipelines.queue.cron import InvalidCron, fire_times, validate_cron
from rota.pipelines.queue.scheduling import live_hours

UTC = timezone.utc


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def iso(instants):
    return [t.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ") for t in instants]


@pytest.mark.parametrize("zone, cron, start, end, expected", [
    # New York springs forward 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z): 02:30 does not
    # exist and fires once at 03:00 EDT.
    ("America/New_York", "30 2 * * *", utc(2026, 3, 7), utc(2026, 3, 10),
     ["2026-03-07T07:30Z", "2026-03-08T07:00Z", "2026-03-09T06:30Z"]),
    # Every minute of the gap maps to one instant, which fires once.
    ("America/New_York", "*/10 2 * * *", utc(2026, 3, 8), utc(2026, 3, 9), ["2026-03-08T07:00Z"]),
    # New York falls back 2026-11-01 02:00 EDT -> 01:00 EST: 01:30 happens twice, fires once.
    ("America/New_York", "30 1 * * *", utc(2026, 10, 31), utc(2026, 11, 3),
     ["2026-10-31T05:30Z", "2026-11-01T05:30Z", "2026-11-02T06:30Z"]),
    # London springs forward 2026-03-29 01:00 GMT -> 02:00 BST (01:00Z).
    ("Europe/London", "30 1 * * *", utc(2026, 3, 28), utc(2026, 3, 31),
     ["2026-03-28T01:30Z", "2026-03-29T01:00Z", "2026-03-30T00:30Z"]),
    # London falls back 2026-10-25 02:00 BST -> 01:00 GMT: the repeated 01:00 fires once.
    ("Europe/London", "0 * * * *", utc(2026, 10, 24, 23), utc(2026, 10, 25, 3),
     ["2026-10-24T23:00Z", "2026-10-25T00:00Z", "2026-10-25T02:00Z"]),
    ("Asia/Kathmandu", "0 9 * * 1-5", utc(2026, 8, 28), utc(2026, 9, 1),
     ["2026-08-28T03:15Z", "2026-08-31T03:15Z"]),
])
def test_fire_times_follow_the_dst_policy(zone, cron, start, end, expected):
    assert iso(fire_times(cron, zone, start, end)) == expected


def test_a_window_is_half_open_so_adjacent_hours_never_share_a_fire_time():
    first = fire_times("*/15 * * * *", "UTC", utc(2026, 8, 31, 10), utc(2026, 8, 31, 11))
    second = fire_times("*/15 * * * *", "UTC", utc(2026, 8, 31, 11), utc(2026, 8, 31, 12))
    assert iso(first) == ["2026-08-31T10:00Z", "2026-08-31T10:15Z", "2026-08-31T10:30Z", "2026-08-31T10:45Z"]
    assert first[-1] < second[0] and len(second) == 4


@pytest.mark.parametrize("cron, message", [
    ("* * * *", "has 4 fields"),
    ("0 0 * * * *", "has 6 fields"),
    ("61 * * * *", "not a valid cron"),
    ("@hourly", "has 1 fields"),
])
def test_invalid_crons_are_refused_naming_them(cron, message):
    with pytest.raises(InvalidCron, match=message):
        validate_cron(cron)


def test_live_delivery_queues_the_next_hour_ahead_of_its_first_fire_time():
    assert live_hours(utc(2026, 8, 31, 10, 54), timedelta(minutes=15), timedelta(minutes=5)) == [utc(2026, 8, 31, 10)]
    assert live_hours(utc(2026, 8, 31, 10, 55), timedelta(minutes=15), timedelta(minutes=5)) == [
        utc(2026, 8, 31, 10), utc(2026, 8, 31, 11)]
    assert live_hours(utc(2026, 8, 31, 11, 10), timedelta(minutes=15), timedelta(minutes=5)) == [
        utc(2026, 8, 31, 10), utc(2026, 8, 31, 11)]
