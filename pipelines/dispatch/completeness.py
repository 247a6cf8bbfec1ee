"""Completeness of a dispatch, from `duty` and `task` alone (SPEC §6).

The check knows nothing of what a run planned or offered: it restates the rules of SPEC
§4 in SQL over the duties as they are and looks for the tasks. A gap the planner never
offered (a watermark that hid a period, a bug that dropped a duty) shows here as what
it is: a duty and a period with no task.

- Scheduled run at `t`: every eligible duty (active, recurring, of the frequency, its
  local today inside its window) has its current period, unless that period is due
  outside the window or lies outside the run's partition range.
- Backfill at `as_of`: every requested period of every active recurring duty of the
  frequency, due inside the duty's window, that a scheduled run at `as_of` would reach
  (its start or its visible_from on or before the duty's today).

Either way a duty is judged only if it was already eligible at the instant judged
(`eligible_since`, migration 0017): one created, unpaused or re-windowed later owed
that run nothing.
"""

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine

from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.reading import local_today
from rota.pipelines.periods.calendar import Period, calendar_units, open_range, periods_between
from rota.resources.database.queries import queries

SHOWN = 20
FRESHNESS_CHECK = "current_period_dispatched"
# A period is owed its tasks once the tick after it opened has had an hour to run.
GRACE = timedelta(hours=1)

QUERIES = queries("rota.pipelines.dispatch")


@dataclass(frozen=True)
class Gaps:
    """Missing (duty, period) pairs: `count` of them and the `first` few, less those of
    duties the run found held by another transaction, which are listed in `held` (the
    first few) and counted in `held_count`. `periods` and `held_periods` count both kinds
    per period key."""

    count: int
    first: list[tuple[int, str]]
    held: list[tuple[int, str]] = field(default_factory=list)
    held_count: int = 0
    periods: Counter = field(default_factory=Counter)
    held_periods: Counter = field(default_factory=Counter)

    def of_period(self, key: str) -> "Gaps":
        """The gaps of one period alone."""
        return Gaps(self.periods[key], [pair for pair in self.first if pair[1] == key],
                    [pair for pair in self.held if pair[1] == key], self.held_periods[key])

    def describe(self) -> str:
        parts = []
        if self.count:
            parts.append(f"{self.count} missing: {_listed(self.first, self.count)}")
        if self.held_count:
            parts.append(f"{self.held_count} waiting on another transaction's lock: {_listed(self.held, self.held_count)} "
                         f"(the duty row is locked by another transaction, as by SELECT … FOR UPDATE or an uncommitted "
                         f"DELETE; the first run after it ends makes the task)")
        return "; ".join(parts) or "nothing missing"


def _listed(pairs: list[tuple[int, str]], count: int) -> str:
    if not pairs:
        return "the run's log names the first of the whole run"
    shown = ", ".join(f"duty {duty_id} has no task for {key}" for duty_id, key in pairs)
    return shown + (f" and {count - len(pairs)} more" if count > len(pairs) else "")


def find_gaps(engine: Engine, *, frequency: str, mode: Mode, as_of: datetime, requested: list[Period],
              parallel: int = 1, held: set[int] = frozenset()) -> Gaps:
    """The (duty, period) pairs the rules require after a run of `requested` at `as_of`
    that have no task: how many, and the first few in (duty, period) order; those of the
    `held` duties (DispatchReport.held) apart."""
    params = {**local_today(as_of), **calendar_units(frequency), "frequency": frequency, "as_of": as_of,
              # Held pairs come first: room for all of them, then SHOWN others.
              "shown": SHOWN + len(held) * len(requested), "held": sorted(held)}
    if mode is Mode.SCHEDULED:
        gaps = QUERIES["scheduled_gaps"]
        # A scheduled run is judged on each duty's current period only: the keys current
        # somewhere on Earth at `as_of`, within the run's range. The lead periods of the
        # range would only widen every probe to partitions no current key lies in.
        current_first, current_last = open_range(frequency, as_of, 0)
        params.update(first_key=max(requested[0].key, current_first.key),
                      last_key=min(requested[-1].key, current_last.key))
    else:
        gaps = QUERIES["backfill_gaps"]
        params.update(keys=[p.key for p in requested], starts=[p.start for p in requested],
                      dues=[p.end for p in requested])
    query = QUERIES["gaps_answered"].replace("/* gaps */", gaps.rstrip().rstrip(";"))
    with engine.connect() as conn:
        lo, hi = conn.exec_driver_sql(QUERIES["id_range"], (frequency,)).one()
        conn.rollback()
    if lo is None:
        return Gaps(0, [])
    # Each probe is one index lookup, and a million of them is seconds of one backend's
    # time: split by duty id, they run on `parallel` connections at once.
    step = (hi - lo) // parallel + 1
    ranges = [(start, min(start + step - 1, hi)) for start in range(lo, hi + 1, step)]

    def part(bounds: tuple[int, int]) -> list:
        with engine.connect() as conn:
            cursor = conn.connection.driver_connection.cursor()
            rows = cursor.execute(query, {**params, "lo": bounds[0], "hi": bounds[1]}).fetchall()
            conn.rollback()
        return rows

    if len(ranges) == 1:
        parts = [part(ranges[0])]
    else:
        with ThreadPoolExecutor(max_workers=len(ranges), thread_name_prefix=f"check-{frequency}") as pool:
            parts = list(pool.map(part, ranges))
    count = sum(rows[0][2] for rows in parts if rows)
    held_count = sum(rows[0][3] for rows in parts if rows)
    found = sorted((duty_id, key) for rows in parts for duty_id, key, *_ in rows)
    return Gaps(count - held_count, [pair for pair in found if pair[0] not in held][:SHOWN],
                [pair for pair in found if pair[0] in held][:SHOWN], held_count,
                sum((Counter(rows[0][4]) for rows in parts if rows), Counter()),
                sum((Counter(rows[0][5]) for rows in parts if rows), Counter()))


def stale_periods(engine: Engine, frequency: str, now: datetime) -> Gaps:
    """Eligible duties without the task of the period they have been in for GRACE: the
    scheduled-run rules as of GRACE ago, over the periods current anywhere then."""
    as_of = now - GRACE
    return find_gaps(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=as_of,
                     requested=periods_between(*open_range(frequency, as_of, 0)))
