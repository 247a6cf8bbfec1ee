"""Cron fire times in a job's own timezone. Pure: an expression, a zone and a window in,
instants out.

croniter matches wall-clock times; mapping a wall-clock time to an instant is where DST
bites, so that step is ours and its policy is explicit:
- a time in the spring-forward gap (02:30 on the night clocks jump 02:00 -> 03:00) does
  not exist; it fires once, at the first instant after the gap (03:00 local);
- a time repeated at fall-back (01:30 happens twice) fires once, at its first occurrence.
Several wall-clock times that map to one instant (every minute of a gap) fire once.
"""

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

UTC = timezone.utc


class InvalidCron(ValueError):
    pass


def validate_cron(expression: str) -> str:
    """A 5-field cron expression croniter accepts, or InvalidCron naming the problem."""
    fields = expression.split()
    if len(fields) != 5:
        raise InvalidCron(f"cron {expression!r} has {len(fields)} fields; rota takes exactly 5 "
                          "(minute hour day-of-month month day-of-week)")
    if not croniter.is_valid(expression):
        raise InvalidCron(f"cron {expression!r} is not a valid cron expression")
    try:
        # Eight years hold every calendar there is (a leap day at least once).
        croniter(expression, datetime(2000, 1, 1), max_years_between_matches=8).get_next(datetime)
    except CroniterBadDateError:
        raise InvalidCron(f"cron {expression!r} never fires: no date matches it (such as February 31)") from None
    return expression


def _first_instant_after_gap(wall: datetime, zone: ZoneInfo) -> datetime:
    """The transition instant that swallowed `wall`: the first instant whose local time
    is later than `wall`."""
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)   # offset after the jump
    high = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)  # offset before the jump
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).replace(tzinfo=None) > wall:
            high = middle
        else:
            low = middle
    return high.replace(microsecond=0)


def wall_to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """A naive local time to the instant it fires at, under the DST policy above."""
    first = wall.replace(tzinfo=zone, fold=0)
    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall:
        return _first_instant_after_gap(wall, zone)
    return first.astimezone(UTC)


def fire_times(expression: str, timezone_name: str, start: datetime, end: datetime) -> list[datetime]:
    """Every fire time in [start, end), as UTC instants, in order, each once."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("fire_times needs instants with a UTC offset")
    zone = ZoneInfo(timezone_name)
    # Walk wall-clock times from a little before the window: a gap can push an earlier
    # wall time's instant into the window.
    wall = (start.astimezone(zone) - timedelta(hours=3)).replace(tzinfo=None, second=0, microsecond=0)
    last_wall = (end.astimezone(zone) + timedelta(hours=3)).replace(tzinfo=None)
    matches = croniter(validate_cron(expression), wall - timedelta(minutes=1))
    seen: set[datetime] = set()
    result = []
    while (wall := matches.get_next(datetime)) <= last_wall:
        instant = wall_to_instant(wall, zone)
        if start <= instant < end and instant not in seen:
            seen.add(instant)
            result.append(instant)
    return sorted(result)
