"""Calendar periods of a recurring duty (SPEC §3). Pure: dates in, periods out.

Keys of one frequency are fixed-width and zero-padded, so lexical order is
chronological; keys of different frequencies are never compared.
"""

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache
import zoneinfo
from zoneinfo import ZoneInfo

import pendulum

from rota.resources.database.schema import FREQUENCIES

# Local dates anywhere on Earth at one instant lie within [UTC-12, UTC+14].
EARLIEST_UTC_OFFSET = timedelta(hours=-12)
LATEST_UTC_OFFSET = timedelta(hours=14)


@dataclass(frozen=True, order=True)
class Period:
    start: date
    end: date
    frequency: str
    key: str

    @property
    def partition_key(self) -> str:
        """The Dagster partition key: the period's first day (a Monday for weeks)."""
        return self.start.isoformat()


def _key(frequency: str, start: pendulum.Date) -> str:
    if frequency == "daily":
        return start.isoformat()
    if frequency == "weekly":
        year, week, _ = start.isocalendar()
        return f"{year:04d}-W{week:02d}"
    if frequency == "monthly":
        return f"{start.year:04d}-{start.month:02d}"
    if frequency == "quarterly":
        return f"{start.year:04d}-Q{(start.month - 1) // 3 + 1}"
    return f"{start.year:04d}"


@dataclass(frozen=True)
class Calendar:
    """One frequency's period arithmetic, for Python and for SQL alike: the one place a
    period rule is written (the queries take unit, interval and key_format as parameters)."""

    unit: str  # the unit a period starts on: pendulum's, and date_trunc's
    step: dict[str, int]  # one period, as pendulum's add() takes it
    interval: str  # one period, as a PostgreSQL interval
    key_format: str  # the period key, as to_char formats the period's start (as _key makes it)
    key_pattern: str  # every key, and nothing else (the task partitions' function matches the same)


CALENDARS = {
    "daily": Calendar("day", {"days": 1}, "1 day", "YYYY-MM-DD", r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"),
    "weekly": Calendar("week", {"weeks": 1}, "1 week", 'IYYY-"W"IW', r"\d{4}-W(0[1-9]|[1-4]\d|5[0-3])"),
    "monthly": Calendar("month", {"months": 1}, "1 month", "YYYY-MM", r"\d{4}-(0[1-9]|1[0-2])"),
    "quarterly": Calendar("quarter", {"months": 3}, "3 months", 'YYYY-"Q"Q', r"\d{4}-Q[1-4]"),
    "yearly": Calendar("year", {"years": 1}, "1 year", "YYYY", r"\d{4}"),
}


def _check(frequency: str) -> None:
    if frequency not in FREQUENCIES:
        raise ValueError(f"unknown frequency {frequency!r}; expected one of {', '.join(FREQUENCIES)}")


def _period(frequency: str, start: pendulum.Date) -> Period:
    end = start.add(**CALENDARS[frequency].step).subtract(days=1)
    return Period(date(start.year, start.month, start.day), date(end.year, end.month, end.day),
                  frequency, _key(frequency, start))


@lru_cache(maxsize=65536)
def period_containing(frequency: str, day: date) -> Period:
    _check(frequency)
    local = pendulum.date(day.year, day.month, day.day)
    unit = CALENDARS[frequency].unit
    start = local if unit == "day" else local.start_of("week") if unit == "week" else local.first_of(unit)
    return _period(frequency, start)


def following(period: Period) -> Period:
    return period_containing(period.frequency, period.end + timedelta(days=1))


def period_from_partition_key(frequency: str, partition_key: str) -> Period:
    """The period a partition key names; refuses a key that is not a period's first day."""
    try:
        day = date.fromisoformat(partition_key)
    except ValueError:
        raise ValueError(f"{frequency} partition key {partition_key!r} is not a YYYY-MM-DD date") from None
    period = period_containing(frequency, day)
    if period.start != day:
        raise ValueError(
            f"{frequency} partition key {partition_key!r} is not the first day of a period "
            f"(that day lies in {period.key}, which starts {period.start})"
        )
    return period


def periods_between(first: Period, last: Period) -> list[Period]:
    if first.frequency != last.frequency:
        raise ValueError(f"a period range cannot mix {first.frequency} and {last.frequency}")
    if last < first:
        raise ValueError(f"period range ends ({last.key}) before it starts ({first.key})")
    periods = [first]
    while periods[-1] != last:
        periods.append(following(periods[-1]))
    return periods


def local_date(instant: datetime, timezone: str) -> date:
    """The calendar date in `timezone` at `instant` (which must carry an offset)."""
    if instant.tzinfo is None:
        raise ValueError(f"instant {instant.isoformat()} has no UTC offset")
    return instant.astimezone(_zone(timezone)).date()


# Converting through pendulum reloads the zone on every call, and stdlib's own cache
# keeps only a handful strongly: a run touches every zone once per group.
_zone = lru_cache(maxsize=None)(ZoneInfo)


@lru_cache(maxsize=64)
def local_dates(instant: datetime) -> tuple[tuple[date, str], ...]:
    """Each calendar date some zone is on at `instant` (two or three of them), with the
    comma-separated names of the zones on it: what SQL compares against, so that SQL
    never does zone arithmetic of its own. PostgreSQL's tz database and Python's are
    separate releases and disagree now and then (Africa/Casablanca at the turn of 2027:
    UTC+0 in one, UTC+1 in the other); the planner's answer is the one."""
    zones_on: dict[date, list[str]] = {}
    for name in sorted(_available_zones()):
        zones_on.setdefault(local_date(instant, name), []).append(name)
    return tuple((day, ",".join(names)) for day, names in sorted(zones_on.items()))


@lru_cache(maxsize=1)
def _available_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def open_range(frequency: str, instant: datetime, max_lead_days: int) -> tuple[Period, Period]:
    """Every period a scheduled run at `instant` may emit, in any zone, for any lead up to
    `max_lead_days`: from the first period current anywhere on Earth to the period holding
    the latest local date plus the lead."""
    if instant.tzinfo is None:
        raise ValueError(f"instant {instant.isoformat()} has no UTC offset")
    utc = instant.astimezone(pendulum.UTC)
    earliest = (utc + EARLIEST_UTC_OFFSET).date()
    latest = (utc + LATEST_UTC_OFFSET).date() + timedelta(days=max_lead_days)
    return period_containing(frequency, earliest), period_containing(frequency, latest)


def parse_instant(value: str, name: str = "as_of") -> datetime:
    """An ISO 8601 instant with a UTC offset; a bare local time is ambiguous and refused."""
    try:
        instant = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} {value!r} is not an ISO 8601 instant") from None
    if instant.tzinfo is None:
        raise ValueError(f"{name} {value!r} has no UTC offset (write it like 2026-08-31T20:00:00Z)")
    return instant


def calendar_units(frequency: str) -> dict[str, str]:
    """The `unit`, `step` and `key_format` parameters of a frequency's period arithmetic in SQL."""
    calendar = CALENDARS[frequency]
    return {"unit": calendar.unit, "step": calendar.interval, "key_format": calendar.key_format}
