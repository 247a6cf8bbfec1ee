"""The dispatch planner (SPEC §4). Pure: duty rows, an instant and the requested periods
in; task rows and counts out. No database, no Dagster, no clock.

Work is done once per (timezone, lead_days) group, not per duty: the zone conversion and
the period arithmetic are the same for every duty in a group, and only the effective
window differs per duty.
"""

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from enum import Enum
from typing import Iterable, NamedTuple
from uuid import UUID

from pipelines.periods import Period, following, local_date, period_containing


class Mode(str, Enum):
    SCHEDULED = "scheduled"
    BACKFILL = "backfill"


class DutyRow(NamedTuple):
    id: int
    workspace_id: UUID
    kind: str
    frequency: str | None
    timezone: str
    lead_days: int
    effective_from: date | None
    effective_to: date | None
    state: str
    last_dispatched_period: str | None = None


class TaskRow(NamedTuple):
    """In the column order the writer copies: duty_id, period_key first (the identity)."""

    duty_id: int
    period_key: str
    workspace_id: UUID
    period_start: date
    due_date: date
    visible_from: date


@dataclass
class Plan:
    tasks: list[TaskRow] = field(default_factory=list)
    # (timezone, outcome) -> count; outcomes: skipped (requested, but beyond what a
    # scheduled run at as_of reaches, or outside the run's partition range) and
    # outside_window (the duty's effective window excludes the period).
    counts: Counter = field(default_factory=Counter)
    unplannable: dict[int, str] = field(default_factory=dict)
    timezone_of: dict[int, str] = field(default_factory=dict)


def _visible_from(period: Period, lead_days: int) -> date:
    return period.end - timedelta(days=lead_days)


def _in_window(duty: DutyRow, day: date) -> bool:
    return (duty.effective_from is None or duty.effective_from <= day) and (
        duty.effective_to is None or day <= duty.effective_to
    )


def dispatchable(duty: DutyRow, frequency: str) -> bool:
    """Only active recurring duties of the asset's frequency produce tasks, in either mode."""
    return duty.kind == "recurring" and duty.state == "active" and duty.frequency == frequency


def _scheduled_candidates(frequency: str, today: date, lead_days: int) -> list[Period]:
    """The current period, unconditionally, and every later one whose lead window is open."""
    periods = [period_containing(frequency, today)]
    while _visible_from(nxt := following(periods[-1]), lead_days) <= today:
        periods.append(nxt)
    return periods


def plan(
    duties: Iterable[DutyRow],
    *,
    frequency: str,
    mode: Mode,
    as_of: datetime,
    requested: list[Period],
) -> Plan:
    """Task rows for `duties` at `as_of`, restricted to the `requested` periods.

    Scheduled: the current period and every later one whose `visible_from <= today`,
    only while `today` is inside the duty's window, and never a period at or below the
    duty's `last_dispatched_period` (those exist already, and a scheduled run fills no
    gap): in steady state a scheduled run offers nothing. Backfill: every requested period a
    scheduled run at `as_of` would have reached (start or visible_from on or before
    today); the rest are counted as skipped. Both: a period is produced only if its
    due date lies in the duty's effective window.
    """
    if as_of.tzinfo is None:
        raise ValueError(f"as_of {as_of.isoformat()} has no UTC offset")
    requested_keys = {p.key for p in requested}
    groups: dict[tuple[str, int], list[DutyRow]] = defaultdict(list)
    for duty in duties:
        if dispatchable(duty, frequency):
            groups[(duty.timezone, duty.lead_days)].append(duty)

    result = Plan()
    for (timezone, lead_days), members in groups.items():
        for duty in members:
            result.timezone_of[duty.id] = timezone
        try:
            today = local_date(as_of, timezone)
        except Exception as error:  # an unknown zone must not stop the other groups
            for duty in members:
                result.unplannable[duty.id] = f"timezone {timezone!r}: {error}"
            continue
        if mode is Mode.SCHEDULED:
            due = _scheduled_candidates(frequency, today, lead_days)
            candidates = [p for p in due if p.key in requested_keys]
        else:
            due = requested
            candidates = [p for p in requested
                          if p.start <= today or _visible_from(p, lead_days) <= today]
        beyond = len(due) - len(candidates)
        scheduled = mode is Mode.SCHEDULED
        rows = [(p.key, p.start, p.end, _visible_from(p, lead_days)) for p in candidates]
        skipped = outside = dispatched = 0
        for duty in members:
            windowed = duty.effective_from is not None or duty.effective_to is not None
            if scheduled and windowed and not _in_window(duty, today):
                continue
            skipped += beyond
            last = duty.last_dispatched_period if scheduled else None
            for key, start, end, visible in rows:
                if last is not None and key <= last:
                    dispatched += 1
                elif windowed and not _in_window(duty, end):
                    outside += 1
                else:
                    result.tasks.append(TaskRow(duty.id, key, duty.workspace_id, start, end, visible))
        for outcome, n in (("skipped", skipped), ("outside_window", outside), ("existing", dispatched)):
            if n:
                result.counts[(timezone, outcome)] += n
    # Identity order: racing writers that insert in different orders deadlock.
    result.tasks.sort()
    return result
