"""Reading the duties a run may have work for, a keyset page at a time.

A scheduled run reads only the duties that may still lack a task of a period it could
emit (the pre-filter below); a backfill reads every dispatchable duty of the frequency."""

from datetime import datetime

from sqlalchemy import Engine

from rota.pipelines.dispatch.planner import DutyRow
from rota.pipelines.periods.calendar import calendar_units, local_dates

_READ_PAGE = """
    SELECT id, kind, frequency, timezone, lead_days, effective_from, effective_to, state,
           complete_from, complete_through, CAST(CAST(d.xmin AS text) AS bigint), last_dispatched_period
    FROM duty d
    {local_dates}
    WHERE frequency = %(frequency)s AND kind = 'recurring' AND state = 'active' AND id > %(after)s
      AND {has_work}
    ORDER BY id
    LIMIT %(page_size)s
"""

# A scheduled run offers a duty nothing when its local today lies outside its window, or
# when the span its last scheduled run proved complete (complete_from..complete_through,
# cleared by migration 0007's triggers whenever a task goes or the window moves) covers
# every period this run could emit for it: from the current period to the newest one
# (_NEWEST_EMITTABLE). Every such period inside the window then has a task, so skipping
# the duty changes nothing that is created; last_dispatched_period proves nothing of the
# kind (a backfill of a later period moves it past a current period that does not exist)
# and takes no part. Computing the keys in SQL keeps such duties out of the read, so a
# run that has nothing to do reads (almost) nothing. It is a pre-filter only: every duty
# it lets through is planned by the planner, and a test holds it against the planner's
# full rules after random backfills, pauses and edits. Each zone's today comes from Python (the
# planner's calendar); a zone Python does not know has no today and is always read, so
# the planner can report it. Dates are cast to `timestamp` so no session TimeZone takes
# part in the calendar arithmetic.
#
# Today is an expression, not a join: a join with the zone list cannot hand rows on in
# index order, so every page would sort all the duties after it (docs/perf.md). `= ANY`
# of a constant array is a hash lookup, and a zone's today is one of the two or three
# dates on Earth at that instant, so it takes one `WHEN` per date.
_TODAY = "CROSS JOIN LATERAL (SELECT CASE {whens} END AS today) z"
_TODAY_WHEN = "WHEN d.timezone = ANY(string_to_array(%(zones_{n})s, ',')) THEN CAST(%(day_{n})s AS date)"


def _newest_period_due_by(day: str) -> str:
    """SQL: the start of the newest period (of the run's frequency) whose last day is on or
    before `day`, a timestamp expression."""
    start = f"date_trunc(%(unit)s, {day})"
    return (f"CASE WHEN {start} + CAST(%(step)s AS interval) - interval '1 day' <= {day} THEN {start} "
            f"ELSE date_trunc(%(unit)s, {start} - interval '1 day') END")


# The newest period a scheduled run may emit for a duty: the current period, or the last
# one whose visible_from has come if later, but none due after the duty's window closes.
_NEWEST_EMITTABLE = f"""
    least(greatest(date_trunc(%(unit)s, CAST(z.today AS timestamp)),
                   {_newest_period_due_by("CAST(z.today + d.lead_days AS timestamp)")}),
          CASE WHEN d.effective_to IS NOT NULL
               THEN {_newest_period_due_by("CAST(d.effective_to AS timestamp)")} END)
"""
_SCHEDULED_HAS_WORK = f"""
    (z.today IS NULL OR (
        (d.effective_from IS NULL OR d.effective_from <= z.today)
        AND (d.effective_to IS NULL OR z.today <= d.effective_to)
        AND NOT (d.complete_from IS NOT NULL
                 AND d.complete_from <= to_char(date_trunc(%(unit)s, CAST(z.today AS timestamp)), %(key_format)s)
                 AND to_char({_NEWEST_EMITTABLE}, %(key_format)s) <= d.complete_through)))
"""

def local_today(instant: datetime) -> tuple[str, dict]:
    """A `CROSS JOIN LATERAL` giving each row of `duty d` its local date `z.today` at
    `instant` by the planner's calendar (NULL for a zone Python does not know), and its
    parameters."""
    days = local_dates(instant)
    params = {}
    # Strings, not arrays: a 600-element text array costs more to bind than the whole
    # query takes to run. Zone names hold no comma.
    for n, (day, zones) in enumerate(days):
        params.update({f"zones_{n}": zones, f"day_{n}": day})
    return _TODAY.format(whens=" ".join(_TODAY_WHEN.format(n=n) for n in range(len(days)))), params


def read_pages(engine: Engine, frequency: str, page_size: int, scheduled_at: datetime | None = None):
    """Yield the dispatchable duties of one frequency, a keyset page at a time. With
    `scheduled_at`, only those a scheduled run at that instant may still have work for."""
    if scheduled_at is None:
        query, params = _READ_PAGE.format(local_dates="", has_work="true"), {}
    else:
        today, params = local_today(scheduled_at)
        query = _READ_PAGE.format(local_dates=today, has_work=_SCHEDULED_HAS_WORK)
        params.update(calendar_units(frequency))
    params.update(frequency=frequency, page_size=page_size)
    after = 0
    while True:
        with engine.connect() as conn:
            cursor = conn.connection.driver_connection.cursor()
            rows = cursor.execute(query, {**params, "after": after}).fetchall()
            conn.rollback()
        if rows:
            yield [DutyRow._make(row) for row in rows]
        if len(rows) < page_size:
            return
        after = rows[-1][0]
