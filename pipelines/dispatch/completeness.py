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

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.reading import local_today
from rota.pipelines.periods.calendar import calendar_units
from rota.pipelines.periods.calendar import Period, open_range, periods_between

SHOWN = 20
FRESHNESS_CHECK = "current_period_dispatched"
# A period is owed its tasks once the tick after it opened has had an hour to run.
GRACE = timedelta(hours=1)

# A duty that became eligible after the instant judged owed nothing to it (SPEC §6).
_ELIGIBLE = """
    d.frequency = %(frequency)s AND d.kind = 'recurring' AND d.state = 'active' AND z.today IS NOT NULL
    AND d.eligible_since <= %(as_of)s
"""

# One probe of task_dispatch_identity per (duty, period), whatever the statistics say. As an
# anti-join, the planner trusted a partition analyzed before a dispatch filled it, so it
# materialized a scan of what it expected to be a few rows and compared every duty with
# all of it (minutes: docs/perf.md). A LATERAL with a LIMIT is never flattened into a
# join, so its scan runs once per row and only an index lookup is cheap enough to be chosen.
# Each probe also names the run's keys as constants, which prune it to the partitions that
# can hold them (on period_key alone, every partition is probed).
_ID_RANGE = "SELECT min(id), max(id) FROM duty WHERE frequency = %s"

_PROBE = """
    LEFT JOIN LATERAL (SELECT 1 AS one FROM task t
                       WHERE t.duty_id = d.id AND t.period_key = {key} AND {keys} LIMIT 1) found ON true
"""
_SCHEDULED_GAPS = f"""
    SELECT d.id, c.period_key, count(*) OVER ()
    FROM duty d
    {{today}}
    CROSS JOIN LATERAL (
        SELECT to_char(s.start, %(key_format)s) AS period_key,
               CAST(s.start + CAST(%(step)s AS interval) - interval '1 day' AS date) AS due_date
        FROM (SELECT date_trunc(%(unit)s, CAST(z.today AS timestamp)) AS start) s
    ) c
    {_PROBE.format(key="c.period_key", keys="t.period_key BETWEEN %(first_key)s AND %(last_key)s")}
    WHERE {_ELIGIBLE} AND d.id BETWEEN %(lo)s AND %(hi)s
      AND (d.effective_from IS NULL OR d.effective_from <= z.today)
      AND (d.effective_to IS NULL OR z.today <= d.effective_to)
      AND (d.effective_from IS NULL OR d.effective_from <= c.due_date)
      AND (d.effective_to IS NULL OR c.due_date <= d.effective_to)
      AND c.period_key BETWEEN %(first_key)s AND %(last_key)s
      AND found.one IS NULL
    ORDER BY d.id
    LIMIT {SHOWN}
"""

_BACKFILL_GAPS = f"""
    SELECT d.id, p.period_key, count(*) OVER ()
    FROM duty d
    {{today}}
    CROSS JOIN unnest(CAST(%(keys)s AS text[]), CAST(%(starts)s AS date[]), CAST(%(dues)s AS date[]))
        AS p(period_key, period_start, due_date)
    {_PROBE.format(key="p.period_key", keys="t.period_key = ANY(%(keys)s)")}
    WHERE {_ELIGIBLE} AND d.id BETWEEN %(lo)s AND %(hi)s
      AND (d.effective_from IS NULL OR d.effective_from <= p.due_date)
      AND (d.effective_to IS NULL OR p.due_date <= d.effective_to)
      AND (p.period_start <= z.today OR p.due_date - d.lead_days <= z.today)
      AND found.one IS NULL
    ORDER BY d.id, p.period_key
    LIMIT {SHOWN}
"""


@dataclass(frozen=True)
class Gaps:
    count: int
    first: list[tuple[int, str]]

    def describe(self) -> str:
        shown = ", ".join(f"duty {duty_id} has no task for {key}" for duty_id, key in self.first)
        more = f" and {self.count - len(self.first)} more" if self.count > len(self.first) else ""
        return f"{self.count} missing: {shown}{more}"


def find_gaps(engine: Engine, *, frequency: str, mode: Mode, as_of: datetime, requested: list[Period],
              parallel: int = 1) -> Gaps:
    """The (duty, period) pairs the rules require after a run of `requested` at `as_of`
    that have no task: how many, and the first few in (duty, period) order."""
    today, params = local_today(as_of)
    params.update(calendar_units(frequency), frequency=frequency, as_of=as_of)
    if mode is Mode.SCHEDULED:
        query = _SCHEDULED_GAPS.format(today=today)
        # A scheduled run is judged on each duty's current period only: the keys current
        # somewhere on Earth at `as_of`, within the run's range. The lead periods of the
        # range would only widen every probe to partitions no current key lies in.
        current_first, current_last = open_range(frequency, as_of, 0)
        params.update(first_key=max(requested[0].key, current_first.key),
                      last_key=min(requested[-1].key, current_last.key))
    else:
        query = _BACKFILL_GAPS.format(today=today)
        params.update(keys=[p.key for p in requested], starts=[p.start for p in requested],
                      dues=[p.end for p in requested])
    with engine.connect() as conn:
        lo, hi = conn.exec_driver_sql(_ID_RANGE, (frequency,)).one()
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
    first = sorted((duty_id, key) for rows in parts for duty_id, key, _ in rows)[:SHOWN]
    return Gaps(count, first)


def stale_periods(engine: Engine, frequency: str, now: datetime) -> Gaps:
    """Eligible duties without the task of the period they have been in for GRACE: the
    scheduled-run rules as of GRACE ago, over the periods current anywhere then."""
    as_of = now - GRACE
    return find_gaps(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=as_of,
                     requested=periods_between(*open_range(frequency, as_of, 0)))
