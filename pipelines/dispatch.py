"""The dispatch writer: reads duties in keyset pages, plans each page, writes the tasks.

Each page is one transaction, written one of two ways. A page whose every task lies
after its duty's last_dispatched_period (none of them should exist) moves its duties
in one UPDATE and COPYs its tasks. Any other page is one set-based statement (`INSERT …
SELECT … RETURNING`) over rows copied into a temporary table, which filters out the
rows that already exist, so a run that changes nothing writes nothing, not even a
consumed identity value. On either path, a task a racing writer made first makes
task_dispatch_identity refuse the page, which is written again with `ON CONFLICT ON
CONSTRAINT task_dispatch_identity DO NOTHING`. The dispatcher never updates or deletes
a task.
"""

import gc
import logging
import random
import struct
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Callable, Iterator, TypeVar

from psycopg import errors as pg_errors
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from pipelines.periods import Period, following, local_dates
from pipelines.planner import DutyRow, Mode, PeriodRow, Plan, Slice, plan

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 20_000
DEFAULT_WRITERS = 3
DEADLOCK_RETRIES = 8

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
# index order, so every page would sort all the duties after it (370 ms a page, against
# 100 ms). `= ANY` of a constant array is a hash lookup, and a zone's today is one of the
# two or three dates on Earth at that instant, so it takes one `WHEN` per date.
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
_UNITS = {"daily": ("day", "1 day", "YYYY-MM-DD"), "weekly": ("week", "1 week", 'IYYY-"W"IW'),
          "monthly": ("month", "1 month", "YYYY-MM"), "quarterly": ("quarter", "3 months", 'YYYY-"Q"Q'),
          "yearly": ("year", "1 year", "YYYY")}


# A page's plan reaches the server by binary COPY into two temporary tables: the period
# rows of each (timezone, lead_days) group, and one slice of them per duty. SQL expands
# them into task rows, so no task row is built, sent or bound in Python (shared/PERF.md:
# binding rows costs more than inserting them). The tables live as long as the pooled
# connection and are emptied at every commit. period_key is compared in task's collation:
# in any other, the anti-join cannot use task_dispatch_identity's second column or prune
# task's partitions, and probes every partition for all of a duty's tasks.
_OFFERED_TABLES = (
    """CREATE TEMPORARY TABLE IF NOT EXISTS offered_period (
        period_group int, period_index int, period_key text COLLATE "C",
        period_start date, due_date date, visible_from date, span_from text, span_through text
    ) ON COMMIT DELETE ROWS""",
    """CREATE TEMPORARY TABLE IF NOT EXISTS offered_duty (
        duty_id bigint, period_group int, first_index int, last_index int, version bigint
    ) ON COMMIT DELETE ROWS""",
)
# A backfill page sorts its offered tasks (260,000 for 20,000 duties over 13 months) into
# identity order; at the default 4 MB the sort spills 14 MB to disk. The page also vouches,
# for its own transaction only, that every task it inserts comes from a duty row its
# statement holds (_OFFERED), so task_duty_fkey_insert does not check them again
# (migration 0012).
_PAGE_SETTINGS = ("SELECT set_config('work_mem', '64MB', true), "
                  "set_config('rota.task_duties_held', CAST(pg_current_xact_id() AS text), true)")
_COPY_PERIODS = ("COPY offered_period (period_group, period_index, period_key, period_start, due_date, "
                 "visible_from, span_from, span_through) FROM STDIN (FORMAT BINARY)")
_PERIOD_TYPES = ["int4", "int4", "text", "date", "date", "date", "text", "text"]
_COPY_SLICES = ("COPY offered_duty (duty_id, period_group, first_index, last_index, version) "
                "FROM STDIN (FORMAT BINARY)")
_SLICE_TYPES = ["int8", "int4", "int4", "int4", "int8"]

# The offered tasks, each with its duty's workspace read from the duty row itself, which
# is held FOR KEY SHARE until commit: a duty deleted first offers nothing, and one
# deleted later waits and then finds these tasks (the task_duty_fkey triggers refuse
# it). This is the foreign key's check and lock, done once for the page: the page vouches
# for it (_PAGE_SETTINGS), and the lock must stay or nothing else guards these rows.
_OFFERED = """
    locked AS MATERIALIZED (
        SELECT d.id, d.workspace_id, o.period_group, o.first_index, o.last_index
        FROM offered_duty o
        JOIN duty d ON d.id = o.duty_id AND d.frequency = %(frequency)s
                   AND d.id BETWEEN %(first_id)s AND %(last_id)s
        FOR KEY SHARE OF d
    ),
    offered AS (
        SELECT l.id AS duty_id, p.period_key, l.workspace_id, p.period_start, p.due_date, p.visible_from
        FROM locked l
        JOIN offered_period p ON p.period_group = l.period_group
                             AND p.period_index BETWEEN l.first_index AND l.last_index
    )
"""

# Rows that already exist are filtered out inside the INSERT, so they consume no identity
# value. The page's keys, as a constant, prune the anti-join to the partitions that can
# hold them: joined on period_key alone, the planner probes every partition of task. The happy path is a plain INSERT (PERF.md: 7.1 against 10.7 us a row with ON
# CONFLICT); a racing writer is the only way its anti-join can miss a row, and then
# task_dispatch_identity refuses it, the page's transaction rolls back and is written
# again with ON CONFLICT ON CONSTRAINT task_dispatch_identity DO NOTHING. `last_dispatched_period` moves in the same statement as the tasks that
# move it, and only forward: keys of one frequency sort chronologically. A scheduled run
# also records the span it made complete, but only where the duty row is still the
# version it planned from: anything that cleared the span since (a task deleted, the
# window moved) left a newer version, and the periods the plan took as existing on the
# old span's word are then unproven. A duty given no new task is not written at all.
# A duty's marks after a page gave it tasks, from `n` (its newest new key, the version
# it was planned from and its group's span): last_dispatched_period only forward, and
# the span only onto the version planned from.
_MOVE_MARKS = """SET last_dispatched_period = greatest(d.last_dispatched_period, n.period_key),
            complete_from = CASE WHEN n.span_from IS NULL THEN d.complete_from
                                 WHEN CAST(CAST(d.xmin AS text) AS bigint) = n.version THEN n.span_from END,
            complete_through = CASE WHEN n.span_from IS NULL THEN d.complete_through
                                    WHEN CAST(CAST(d.xmin AS text) AS bigint) = n.version THEN n.span_through END"""
_WRITE_OFFERED = """
    WITH {offered},
    inserted AS (
        INSERT INTO task (duty_id, period_key, workspace_id, period_start, due_date, visible_from)
        SELECT o.duty_id, o.period_key, o.workspace_id, o.period_start, o.due_date, o.visible_from
        FROM offered o
        WHERE NOT EXISTS (
            SELECT 1 FROM task t
            WHERE t.duty_id = o.duty_id AND t.period_key = o.period_key AND t.period_key = ANY(%(keys)s)
        )
        ORDER BY o.duty_id, o.period_key
        {on_conflict}
        RETURNING duty_id, period_key
    ),
    newest AS (
        SELECT i.duty_id, max(i.period_key) AS period_key, count(*) AS created,
               min(o.version) AS version, min(p.span_from) AS span_from, min(p.span_through) AS span_through
        FROM inserted i
        JOIN offered_duty o ON o.duty_id = i.duty_id
        JOIN offered_period p ON p.period_group = o.period_group AND p.period_index = o.first_index
        GROUP BY i.duty_id
    ),
    advanced AS (
        UPDATE duty d
        {move_marks}
        FROM newest n
        WHERE d.id = n.duty_id AND d.frequency = %(frequency)s AND d.id BETWEEN %(first_id)s AND %(last_id)s
          AND (d.last_dispatched_period IS NULL OR d.last_dispatched_period < n.period_key
               OR n.span_from IS NOT NULL)
        RETURNING d.id
    )
    SELECT duty_id, NULL AS period_key, created FROM newest
    UNION ALL
    SELECT NULL, period_key, count(*) FROM inserted GROUP BY period_key
"""
# The bulk path, for a page whose every task lies after its duty's last_dispatched_period
# (Plan.after_dispatched): none of them should exist, so nothing is asked of task. The
# duties move first, and that UPDATE's row locks hold each of them, workspace included,
# until commit: the foreign key's lock, taken once per duty (the page vouches for it,
# _PAGE_SETTINGS). Their tasks then go in by COPY, which PostgreSQL inserts a batch at a
# time (migration 0013), with the workspace the UPDATE returned: a duty deleted or moved
# to another frequency before the UPDATE returns nothing and gets no task. A task that
# exists after all (a racing writer's) makes task_dispatch_identity refuse the COPY, and
# the page is written again by the anti-join with ON CONFLICT, as on the other path. The
# workspace comes back as uuid_send's 16 bytes, the COPY's binary field as it stands.
_ADVANCE_NEW = f"""
    UPDATE duty d
    {_MOVE_MARKS}
    FROM (SELECT o.duty_id, p.period_key, o.version, p.span_from, p.span_through
          FROM offered_duty o
          JOIN offered_period p ON p.period_group = o.period_group AND p.period_index = o.last_index) n
    WHERE d.id = n.duty_id AND d.frequency = %(frequency)s AND d.id BETWEEN %(first_id)s AND %(last_id)s
    RETURNING d.id, uuid_send(d.workspace_id)
"""
# The temporary tables have no statistics, so the planner expects a few hundred duties
# and probes duty_pkey once for each of the 20,000: 43 of a page's 100 ms (EXPLAIN
# ANALYZE, a monthly page). Without nested loops it reads the page's id range of
# duty_dispatch_scan_idx once and hashes (60 ms in all).
_ADVANCE_SETTINGS = "SELECT set_config('enable_nestloop', 'off', true)"
# The bulk path's COPY is written in PostgreSQL's binary COPY format directly: a row is
# its duty's fields followed by its period's, so a duty's tasks are one join of bytes made
# once per duty and once per period. psycopg's write_row formats every field of every row
# instead: 1.4 of the dispatcher's 9 s of Python at a million duties (py-spy), with the
# workspaces loaded as UUID objects only to be dumped again.
_COPY_TASKS = ("COPY task (duty_id, workspace_id, period_key, period_start, due_date, visible_from) "
               "FROM STDIN (FORMAT BINARY)")
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature; no flags, no header extension
_COPY_TRAILER = b"\xff\xff"
_DATE_EPOCH = date(2000, 1, 1).toordinal()  # a binary date counts days from it


def _period_fields(period: PeriodRow) -> bytes:
    """period_key, period_start, due_date and visible_from of a task row, in binary."""
    key = period.key.encode()
    return struct.pack(f">i{len(key)}siiiiii", len(key), key, 4, period.start.toordinal() - _DATE_EPOCH,
                       4, period.end.toordinal() - _DATE_EPOCH, 4, period.visible_from.toordinal() - _DATE_EPOCH)


def _duty_fields(duty_id: int, workspace: bytes) -> bytes:
    """A task row's field count, duty_id and workspace_id, in binary."""
    return struct.pack(">hiqi", 6, 8, duty_id, 16) + workspace


# A partition's share of task_dispatch_identity is named after it (migration 0009), and a
# duplicate is reported under the partition's name.
IDENTITY = "task_dispatch_identity"
# The page's partitions exist before its insert routes rows to them; the function takes
# an advisory lock only when one is missing (the first night of a range, a backfill).
_ENSURE_PARTITIONS = "SELECT rota_ensure_task_partitions(%s::text[])"
_INSERT_NEW = _WRITE_OFFERED.format(offered=_OFFERED, move_marks=_MOVE_MARKS, on_conflict="")
_INSERT_RACING = _WRITE_OFFERED.format(offered=_OFFERED, move_marks=_MOVE_MARKS,
                                       on_conflict=f"ON CONFLICT ON CONSTRAINT {IDENTITY} DO NOTHING")


class DatabaseWentAway(RuntimeError):
    """The connection to PostgreSQL broke mid-run. Pages committed before stay whole
    (each page is one transaction), and the next run completes the rest."""


@dataclass
class DispatchReport:
    frequency: str
    mode: Mode
    as_of: datetime
    first_period: str
    last_period: str
    requested: list[Period] = field(default_factory=list)
    duties_read: int = 0
    pages: int = 0
    # (timezone, outcome) -> count; outcomes: created, existing, skipped, outside_window
    counts: Counter = field(default_factory=Counter)
    # (period_key, outcome) -> count, the same outcomes per requested period
    periods: Counter = field(default_factory=Counter)
    unplannable: dict[int, str] = field(default_factory=dict)
    deadlocks_retried: int = 0
    # Pages written by the bulk path, and pages written again around tasks that existed.
    pages_copied: int = 0
    pages_written_again: int = 0

    def total(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.counts.items() if o == outcome)

    def for_period(self, key: str) -> dict[str, int]:
        return {outcome: self.periods[(key, outcome)]
                for outcome in ("created", "existing", "skipped", "outside_window")}

    def by_timezone(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for (timezone, outcome), n in sorted(self.counts.items()):
            if n:
                table.setdefault(timezone, {})[outcome] = n
        return table


T = TypeVar("T")


def _retrying_deadlocks(work: Callable[[], T]) -> tuple[T, int]:
    """Run one page's transaction, retrying it when PostgreSQL picks it as a deadlock
    victim; returns its result and how many retries it took.

    Inserts go in identity order, which keeps racing writers from deadlocking on the
    unique index; the retry covers what ordering cannot (the duty updates)."""
    for attempt in range(DEADLOCK_RETRIES):
        try:
            return work(), attempt
        except (DBAPIError, pg_errors.Error) as error:  # through SQLAlchemy, or the page's raw cursor
            cause = error.orig if isinstance(error, DBAPIError) else error
            retryable = isinstance(cause, (pg_errors.DeadlockDetected, pg_errors.SerializationFailure))
            if not retryable or attempt == DEADLOCK_RETRIES - 1:
                raise
            log.warning("page write was a deadlock victim; retrying (attempt %d)", attempt + 2)
            time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
    raise AssertionError("unreachable")


@dataclass
class PageWritten:
    # Per duty, the tasks made; None on the bulk path, which made every slice whole but
    # those of `missed` (duties gone before its UPDATE).
    created: dict[int, int] | None
    created_by_period: dict[str, int]
    missed: list[Slice] = field(default_factory=list)
    deadlocks_retried: int = 0
    copied: bool = False
    written_again: bool = False


def write_plan(engine: Engine, page_plan: Plan, frequency: str) -> PageWritten:
    """Write one page's tasks in one transaction."""
    if not page_plan.slices:
        return PageWritten({}, {})

    used = {group: span for group, span in enumerate(page_plan.used) if span}
    keys = sorted({page_plan.groups[group][index][0]
                   for group, (first, last) in used.items() for index in range(first, last + 1)})
    if not page_plan.after_dispatched and _all_offered_exist(engine, page_plan, keys):
        return PageWritten({}, {})

    def work(write: str | None) -> PageWritten:
        with engine.begin() as conn:
            cursor = conn.connection.driver_connection.cursor()
            cursor.execute(_PAGE_SETTINGS)
            cursor.execute(_ENSURE_PARTITIONS, [keys])
            for statement in _OFFERED_TABLES:
                cursor.execute(statement)
            with cursor.copy(_COPY_PERIODS) as copy:
                copy.set_types(_PERIOD_TYPES)
                for group, (first, last) in used.items():
                    periods, span = page_plan.groups[group], page_plan.spans[group] or (None, None)
                    for index in range(first, last + 1):
                        copy.write_row((group, index, *periods[index], *span))
            with cursor.copy(_COPY_SLICES) as copy:
                copy.set_types(_SLICE_TYPES)
                for row in page_plan.slices:
                    copy.write_row(row)
            # The page's frequency and id range let the duty lookups use duty_dispatch_scan_idx.
            bounds = {"frequency": frequency, "first_id": page_plan.slices[0].duty_id,
                      "last_id": page_plan.slices[-1].duty_id, "keys": keys}
            if write is None:
                cursor.execute(_ADVANCE_SETTINGS)
                return _copy_tasks(cursor, page_plan, used, dict(cursor.execute(_ADVANCE_NEW, bounds).fetchall()))
            rows = cursor.execute(write, bounds).fetchall()
            return PageWritten({duty_id: n for duty_id, key, n in rows if key is None},
                               {key: n for duty_id, key, n in rows if key is not None})

    try:
        written, retried = _retrying_deadlocks(lambda: work(None if page_plan.after_dispatched else _INSERT_NEW))
    except pg_errors.UniqueViolation as error:  # the page's own cursor is psycopg's, unwrapped
        if not (error.diag.constraint_name or "").startswith(IDENTITY):
            raise
        log.info("a racing writer made some of this page's tasks first; writing the page again around them")
        written, retried = _retrying_deadlocks(lambda: work(_INSERT_RACING))
        written.written_again = True
    written.deadlocks_retried = retried
    return written


# A duty's offered tasks are one contiguous run of its frequency's periods (planner.Slice),
# and every task of a duty has the duty's frequency: the tasks between the run's first and
# last key are offered ones, and the run is whole when they number its length.
_MISSING_OFFERED = """
    SELECT count(*)
    FROM unnest(%(duty_ids)s::bigint[], %(first_keys)s::text[], %(last_keys)s::text[], %(sizes)s::int[])
         AS o (duty_id, first_key, last_key, size)
    WHERE o.size <> (SELECT count(*) FROM task t
                     WHERE t.duty_id = o.duty_id AND t.period_key BETWEEN o.first_key AND o.last_key
                       AND t.period_key = ANY(%(keys)s))
"""


def _all_offered_exist(engine: Engine, page_plan: Plan, keys: list[str]) -> bool:
    """Whether every task the page offers exists already (a backfill run again), read
    without a transaction that could write: the write would then insert nothing and move
    no mark (a duty given no new task is not written), so it is not begun, and an identical
    run writes nothing at all, not even a transaction id or a temporary table's WAL."""
    slices = page_plan.slices
    with engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()
        missing = cursor.execute(_MISSING_OFFERED, {
            "duty_ids": [s.duty_id for s in slices],
            "first_keys": [page_plan.groups[s.group][s.first][0] for s in slices],
            "last_keys": [page_plan.groups[s.group][s.last][0] for s in slices],
            "sizes": [s.last - s.first + 1 for s in slices],
            "keys": keys}).fetchone()[0]
        conn.rollback()
    return missing == 0


def _copy_tasks(cursor, page_plan: Plan, used: dict[int, tuple[int, int]],
                workspace_of: dict[int, bytes]) -> PageWritten:
    """The bulk path's COPY: the tasks of every duty the page's UPDATE holds, in identity
    order, each with the workspace that UPDATE read."""
    fields = {group: (first, [_period_fields(period) for period in page_plan.groups[group][first:last + 1]])
              for group, (first, last) in used.items()}
    parts, missed = [_COPY_HEADER], []
    for s in page_plan.slices:
        workspace = workspace_of.get(s.duty_id)
        if workspace is None:
            missed.append(s)
            continue
        offset, periods = fields[s.group]
        duty = _duty_fields(s.duty_id, workspace)
        parts.append(duty + duty.join(periods[s.first - offset:s.last - offset + 1]))
    parts.append(_COPY_TRAILER)
    with cursor.copy(_COPY_TASKS) as copy:
        copy.write(b"".join(parts))
    by_period = Counter({key: n for (key, outcome), n in page_plan.periods.items() if outcome == "offered"})
    for s in missed:
        by_period.subtract(period.key for period in page_plan.groups[s.group][s.first:s.last + 1])
    return PageWritten(None, dict(by_period), missed, copied=True)


def ensure_partitions(engine: Engine, keys: list[str]) -> None:
    """Make the task partitions these keys need, in a transaction of their own: a run
    makes those of its range and of the period after it before its first page, so pages
    rarely wait on the advisory lock that serialises the making."""
    with engine.begin() as conn:
        conn.exec_driver_sql(_ENSURE_PARTITIONS, (sorted(set(keys)),))


def _count_written(report: DispatchReport, page_plan: Plan, written: PageWritten) -> None:
    made: Counter = Counter()
    if written.created is None:
        made.update(page_plan.offered)
        for s in written.missed:
            made[page_plan.timezone_of[s.duty_id]] -= s.last - s.first + 1
    else:
        for duty_id, n in written.created.items():
            made[page_plan.timezone_of[duty_id]] += n
    for timezone, offered in page_plan.offered.items():
        report.counts[(timezone, "created")] += made[timezone]
        report.counts[(timezone, "existing")] += offered - made[timezone]
    for (key, outcome), n in page_plan.periods.items():
        if outcome == "offered":
            made = written.created_by_period.get(key, 0)
            report.periods[(key, "created")] += made
            report.periods[(key, "existing")] += n - made
        else:
            report.periods[(key, outcome)] += n
    report.deadlocks_retried += written.deadlocks_retried
    report.pages_copied += written.copied
    report.pages_written_again += written.written_again


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


def calendar_units(frequency: str) -> dict[str, str]:
    """The `unit`, `step` and `key_format` parameters of a frequency's period arithmetic in SQL."""
    unit, step, key_format = _UNITS[frequency]
    return {"unit": unit, "step": step, "key_format": key_format}


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


def _read_ahead(pages: Iterator[list[DutyRow]], reader: ThreadPoolExecutor) -> Iterator[list[DutyRow]]:
    """`pages`, each next one read while the last is planned: a read mostly waits on the
    server, and planning needs the interpreter."""
    coming = reader.submit(next, pages, None)
    while (page := coming.result()) is not None:
        coming = reader.submit(next, pages, None)
        yield page


def dispatch(
    engine: Engine,
    *,
    frequency: str,
    mode: Mode,
    as_of: datetime,
    requested: list[Period],
    page_size: int = DEFAULT_PAGE_SIZE,
    writers: int = DEFAULT_WRITERS,
) -> DispatchReport:
    """Dispatch one frequency's requested periods at `as_of`. Duties the planner cannot
    plan are reported in `unplannable`; the caller fails the run on them after the rest
    is written.

    Up to `writers` pages are written at once, each on its own connection, while the
    next page is read and planned: pages hold disjoint duties, so their transactions
    never wait on each other, and a single writer would leave the server idle during
    planning and one core idle during writing."""
    if not requested:
        raise ValueError("no periods requested")
    ensure_partitions(engine, [period.key for period in requested] + [following(requested[-1]).key])
    report = DispatchReport(frequency, mode, as_of, requested[0].key, requested[-1].key, list(requested))
    scheduled_at = as_of if mode is Mode.SCHEDULED else None
    in_flight: deque[tuple[int, Plan, Future[PageWritten]]] = deque()
    at_page = 1  # the page being read or settled, for the message when the database goes

    def settle_oldest() -> None:
        nonlocal at_page
        at_page, page_plan, writing = in_flight.popleft()
        _count_written(report, page_plan, writing.result())

    # Pages make millions of short-lived objects, and each full pass of the garbage
    # collector would also walk every object the process held before the run: a Dagster
    # run's whole framework (a million-duty run through Dagster took 17.7 s with it walked,
    # 15.1 s frozen). What the run makes is collected as usual, and the freeze ends with it.
    gc.freeze()
    try:
        with ThreadPoolExecutor(max_workers=writers, thread_name_prefix=f"dispatch-{frequency}") as pool, \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"read-{frequency}") as reader:
            for page in _read_ahead(read_pages(engine, frequency, page_size, scheduled_at), reader):
                report.pages += 1
                report.duties_read += len(page)
                page_plan = plan(page, frequency=frequency, mode=mode, as_of=as_of, requested=requested)
                report.counts.update(page_plan.counts)
                report.unplannable.update(page_plan.unplannable)
                in_flight.append((report.pages, page_plan, pool.submit(write_plan, engine, page_plan, frequency)))
                if len(in_flight) >= writers:
                    settle_oldest()
                at_page = report.pages + 1
            while in_flight:
                settle_oldest()
    except (OperationalError, pg_errors.OperationalError) as error:  # through SQLAlchemy, or a raw cursor
        raise DatabaseWentAway(
            f"{frequency} dispatch lost the database during page {at_page} "
            f"({report.total('created')} tasks created in the pages written before it, which stay; "
            f"the next run creates the rest): {getattr(error, 'orig', error)}"
        ) from error
    finally:
        gc.unfreeze()
    return report

