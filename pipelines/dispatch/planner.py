"""The dispatch planner (SPEC §4). Pure: duty rows, an instant and the requested periods
in; task rows and counts out. No database, no Dagster, no clock.

Work is done once per (timezone, lead_days) group, not per duty: the zone conversion and
the period arithmetic are the same for every duty in a group, and only the effective
window differs per duty.
"""

from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from enum import Enum
from functools import lru_cache
from typing import Iterable, Iterator, NamedTuple

from rota.pipelines.periods.calendar import Period, following, local_date, period_containing


class Mode(str, Enum):
    SCHEDULED = "scheduled"
    BACKFILL = "backfill"


class DutyRow(NamedTuple):
    """What planning needs of a duty, and the workspace its tasks are written with."""

    id: int
    kind: str
    frequency: str | None
    timezone: str
    lead_days: int
    effective_from: date | None
    effective_to: date | None
    state: str
    # The span a scheduled run proved complete (migration 0007), and the row version it
    # was read at: a write planned from a span that changed since sets none.
    complete_from: str | None = None
    complete_through: str | None = None
    version: int = 0
    # The newest period the dispatcher wrote for it: a plan whose every task lies after
    # it can go to the writer's bulk path (Plan.after_dispatched). Never a reason to skip.
    last_dispatched_period: str | None = None
    # The workspace as read (uuid_send's 16 bytes), which the bulk path writes its tasks
    # with: its UPDATE moves a duty only while the row still has it. None (a row made by
    # hand, not read) cannot be encoded, so it can never be written as a workspace.
    workspace: bytes | None = None


class PeriodRow(NamedTuple):
    key: str
    start: date
    end: date
    visible_from: date


class Slice(NamedTuple):
    """A duty's tasks: periods `first`..`last` (inclusive) of its group's period list.

    The candidate periods of a (timezone, lead_days) group are chronological, and what
    removes some of them for one duty (at or below its last dispatched period, due
    outside its window) cuts a prefix and a suffix, so a duty's tasks are always one
    contiguous run of them. A plan is therefore a few period rows per group and one
    slice per duty; the writer expands it in SQL, and no task row is built in Python."""

    duty_id: int
    group: int
    first: int
    last: int
    version: int = 0
    workspace: bytes | None = None


@dataclass
class Plan:
    groups: list[tuple[PeriodRow, ...]] = field(default_factory=list)
    # Per group, in a scheduled run: the first and last key of its candidates, the span
    # each of its duties has complete once the plan is written.
    spans: list[tuple[str, str] | None] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)
    # (timezone, outcome) -> count; outcomes: skipped (requested, but beyond what a
    # scheduled run at as_of reaches, or outside the run's partition range),
    # outside_window (the duty's effective window excludes the period) and existing
    # (inside the span its last scheduled run proved complete).
    counts: Counter = field(default_factory=Counter)
    # (period_key, outcome) -> count, the same outcomes per requested period, plus
    # offered: the tasks the writer is to create or find (created + existing).
    periods: Counter = field(default_factory=Counter)
    unplannable: dict[int, str] = field(default_factory=dict)
    timezone_of: dict[int, str] = field(default_factory=dict)
    # timezone -> tasks offered (the slices' sizes), and per group the first and last
    # period index some slice uses (None if none does): a group with a long lead has
    # hundreds of candidate periods, of which a steady-state run needs a handful.
    offered: Counter = field(default_factory=Counter)
    used: list[tuple[int, int] | None] = field(default_factory=list)
    # Every offered task lies after its duty's last_dispatched_period, so none is expected
    # to exist yet: only a racing writer or a task made outside the dispatcher has one.
    after_dispatched: bool = True

    def tasks(self) -> Iterator[tuple[Slice, PeriodRow]]:
        """Each task the plan offers, as its duty's slice and its period, in identity order:
        slices come in duty order, a duty's periods in key order."""
        for s in self.slices:
            for period in self.groups[s.group][s.first:s.last + 1]:
                yield s, period


def _visible_from(period: Period, lead_days: int) -> date:
    return period.end - timedelta(days=lead_days)


def _in_window(duty: DutyRow, day: date) -> bool:
    return (duty.effective_from is None or duty.effective_from <= day) and (
        duty.effective_to is None or day <= duty.effective_to
    )


def dispatchable(duty: DutyRow, frequency: str) -> bool:
    """Only active recurring duties of the asset's frequency produce tasks, in either mode."""
    return duty.kind == "recurring" and duty.state == "active" and duty.frequency == frequency


class Candidates(NamedTuple):
    rows: tuple[PeriodRow, ...]
    keys: tuple[str, ...]
    ends: tuple[date, ...]


def _candidates(periods: Iterable[Period], lead_days: int) -> Candidates:
    rows = tuple(PeriodRow(p.key, p.start, p.end, _visible_from(p, lead_days)) for p in periods)
    return Candidates(rows, tuple(r.key for r in rows), tuple(r.end for r in rows))


@lru_cache(maxsize=4096)
def _scheduled_candidates(frequency: str, today: date, lead_days: int) -> Candidates:
    """The current period, unconditionally, and every later one whose lead window is open.
    Cached: every hourly tick of a local day asks again, and a long lead makes hundreds."""
    periods = [period_containing(frequency, today)]
    while _visible_from(nxt := following(periods[-1]), lead_days) <= today:
        periods.append(nxt)
    return _candidates(periods, lead_days)


def plan(
    duties: Iterable[DutyRow],
    *,
    frequency: str,
    mode: Mode,
    as_of: datetime,
    requested: list[Period],
) -> Plan:
    """The tasks for `duties` at `as_of`, restricted to the `requested` periods, as
    period rows per (timezone, lead_days) group and one slice of them per duty.

    Scheduled: the current period and every later one whose `visible_from <= today`,
    only while `today` is inside the duty's window, less those inside the span its last
    scheduled run proved complete (`complete_from..complete_through`, trusted only when
    it starts at or before the first candidate, so that what it covers is a prefix): in
    steady state a scheduled run offers nothing. Backfill: every requested period a
    scheduled run at `as_of` would have reached (start or visible_from on or before
    today); the rest are counted as skipped. Both: a period is produced only if its
    due date lies in the duty's effective window.
    """
    if as_of.tzinfo is None:
        raise ValueError(f"as_of {as_of.isoformat()} has no UTC offset")
    request = _Request(requested, {p.key for p in requested},
                       all(following(a) == b for a, b in zip(requested, requested[1:])))
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
        candidates, beyond, later = _group_candidates(frequency, mode, today, lead_days, request)
        _plan_group(result, timezone, members, candidates, today, mode is Mode.SCHEDULED, beyond, later)
    # Identity order: racing writers that insert in different orders deadlock.
    result.slices.sort()
    result.counts = +result.counts
    return result


class _Request(NamedTuple):
    periods: list[Period]
    keys: set[str]
    # A range without holes (what every run asks for) lets a scheduled group's candidates
    # be taken whole when its first and last fall inside it.
    contiguous: bool


def _group_candidates(frequency: str, mode: Mode, today: date, lead_days: int,
                      request: _Request) -> tuple[Candidates, int, list[str]]:
    """A group's candidate periods, how many periods a scheduled run at its `today` would
    emit that lie outside the request, and the requested keys it does not reach."""
    if mode is Mode.SCHEDULED:
        due = _scheduled_candidates(frequency, today, lead_days)
        if request.contiguous and due.keys[0] in request.keys and due.keys[-1] in request.keys:
            candidates = due
        else:
            due_keys = set(due.keys)
            candidates = _candidates([p for p in request.periods if p.key in due_keys], lead_days)
        return candidates, len(due.rows) - len(candidates.rows), [p.key for p in request.periods
                                                                  if p.key > due.keys[-1]]
    candidates = _candidates([p for p in request.periods
                              if p.start <= today or _visible_from(p, lead_days) <= today], lead_days)
    reached = set(candidates.keys)
    return candidates, 0, [p.key for p in request.periods if p.key not in reached]


def _plan_group(result: Plan, timezone: str, members: list[DutyRow], candidates: Candidates, today: date,
                scheduled: bool, beyond: int, later: list[str]) -> None:
    """One group's slices and counts, added to `result`."""
    group = len(result.groups)
    result.groups.append(candidates.rows)
    keys, ends = candidates.keys, candidates.ends
    result.spans.append((keys[0], keys[-1]) if scheduled and keys else None)
    count = len(keys)
    # Each duty's existing, outside-window and offered periods are index ranges of the
    # group's candidates: counted per period through difference arrays, not per task.
    ranges = {outcome: [0] * (count + 1) for outcome in ("existing", "outside_window", "offered")}

    def add(outcome: str, start: int, end: int) -> None:
        if start < end:
            ranges[outcome][start] += 1
            ranges[outcome][end] -= 1

    counted = offered = whole = 0
    lowest, highest = count, -1
    for duty in members:
        windowed = duty.effective_from is not None or duty.effective_to is not None
        if scheduled and windowed and not _in_window(duty, today):
            continue
        counted += 1
        proven = scheduled and keys and duty.complete_from is not None and duty.complete_from <= keys[0]
        if not windowed and not proven:
            # Offered every candidate, as most duties on a first run or after a span
            # was cleared: counted for the whole group below, not period by period.
            if count:
                whole += 1
                result.slices.append(Slice(duty.id, group, 0, count - 1, duty.version, duty.workspace))
                if duty.last_dispatched_period is not None and keys[0] <= duty.last_dispatched_period:
                    result.after_dispatched = False
            continue
        done = bisect_right(keys, duty.complete_through) if proven else 0
        first, stop = done, count
        if windowed:
            if duty.effective_from is not None:
                first = max(first, bisect_left(ends, duty.effective_from))
            if duty.effective_to is not None:
                stop = bisect_right(ends, duty.effective_to)
        stop = max(stop, first)
        add("existing", 0, done)
        add("outside_window", done, first)
        add("outside_window", stop, count)
        add("offered", first, stop)
        if stop > first:
            result.slices.append(Slice(duty.id, group, first, stop - 1, duty.version, duty.workspace))
            offered += stop - first
            lowest, highest = min(lowest, first), max(highest, stop - 1)
            if duty.last_dispatched_period is not None and keys[first] <= duty.last_dispatched_period:
                result.after_dispatched = False
    if whole:
        ranges["offered"][0] += whole
        ranges["offered"][count] -= whole
        offered += whole * count
        lowest, highest = 0, count - 1
    result.used.append((lowest, highest) if offered else None)
    if offered:
        result.offered[timezone] += offered
    _count_group(result, timezone, keys, ranges, counted, beyond, later)


def _count_group(result: Plan, timezone: str, keys: tuple[str, ...], ranges: dict[str, list[int]], counted: int,
                 beyond: int, later: list[str]) -> None:
    """A group's outcomes per timezone and per period: its `counted` duties each skip the
    periods beyond and later than the group reaches, and `ranges` hold the rest as
    difference arrays over the group's candidates."""
    result.counts[(timezone, "skipped")] += counted * (beyond + len(later))
    for key in later:
        result.periods[(key, "skipped")] += counted
    for outcome, steps in ranges.items():
        running = 0
        for index, step in enumerate(steps[:len(keys)]):
            running += step
            if running:
                result.periods[(keys[index], outcome)] += running
                if outcome != "offered":
                    result.counts[(timezone, outcome)] += running
