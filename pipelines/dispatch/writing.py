"""Writing one page's plan in one transaction.

A page whose every task lies after its duty's last_dispatched_period (none of them
should exist) moves its duties in one UPDATE and COPYs its tasks. Any other page is one
set-based statement (`INSERT … SELECT … RETURNING`) over rows copied into a temporary
table, which filters out the rows that already exist, so a run that changes nothing
writes nothing, not even a consumed identity value. On either path, a task a racing
writer made first makes task_dispatch_identity refuse the page, which is written again
with `ON CONFLICT ON CONSTRAINT task_dispatch_identity DO NOTHING`. The dispatcher never
updates or deletes a task."""

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from psycopg import errors as pg_errors
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from rota.pipelines.dispatch.binary_copy import COPY_TASKS, encode_tasks
from rota.pipelines.dispatch.planner import Plan, Slice

log = logging.getLogger(__name__)


T = TypeVar("T")
DEADLOCK_RETRIES = 8


# A page's plan reaches the server by binary COPY into two temporary tables: the period
# rows of each (timezone, lead_days) group, and one slice of them per duty. SQL expands
# them into task rows, so no task row is built, sent or bound in Python (binding rows
# costs more than inserting them: docs/perf.md). The tables live as long as the pooled
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
# A backfill page sorts hundreds of thousands of offered tasks into identity order, which
# the default work_mem spills to disk (docs/perf.md). The page also vouches,
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

# Rows that already exist are filtered out inside the INSERT, so they consume no
# identity value. The page's keys, as a constant, prune the anti-join to the partitions
# that can hold them: joined on period_key alone, the planner probes every partition of
# task. The happy path is a plain INSERT, cheaper a row than one with ON CONFLICT
# (docs/perf.md); a racing writer is the only way its anti-join can miss a row, and then
# task_dispatch_identity refuses it, the page's transaction rolls back and is written
# again with ON CONFLICT ON CONSTRAINT task_dispatch_identity DO NOTHING.
# `last_dispatched_period` moves in the same statement as the tasks that move it, and
# only forward: keys of one frequency sort chronologically. A scheduled run also records
# the span it made complete, but only where the duty row is still the version it planned
# from: anything that cleared the span since (a task deleted, the window moved) left a
# newer version, and the periods the plan took as existing on the old span's word are
# then unproven. A duty given no new task is not written at all.
#
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
# and probes duty_pkey once for each of the page's duties. Without nested loops it reads
# the page's id range of duty_dispatch_scan_idx once and hashes (docs/perf.md).
_ADVANCE_SETTINGS = "SELECT set_config('enable_nestloop', 'off', true)"


# A partition's share of task_dispatch_identity is named after it (migration 0009), and a
# duplicate is reported under the partition's name.
IDENTITY = "task_dispatch_identity"
# The page's partitions exist before its insert routes rows to them; the function takes
# an advisory lock only when one is missing (the first night of a range, a backfill).
_ENSURE_PARTITIONS = "SELECT rota_ensure_task_partitions(%s::text[])"
_INSERT_NEW = _WRITE_OFFERED.format(offered=_OFFERED, move_marks=_MOVE_MARKS, on_conflict="")
_INSERT_RACING = _WRITE_OFFERED.format(offered=_OFFERED, move_marks=_MOVE_MARKS,
                                       on_conflict=f"ON CONFLICT ON CONSTRAINT {IDENTITY} DO NOTHING")


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
    data, missed = encode_tasks(page_plan, used, workspace_of)
    with cursor.copy(COPY_TASKS) as copy:
        copy.write(data)
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
