"""Writing one page's plan in one transaction.

A page whose every task lies after its duty's last_dispatched_period (none of them
should exist) moves its duties in one UPDATE and COPYs its tasks. Any other page is one
set-based statement (`INSERT … SELECT … RETURNING`) over rows copied into a temporary
table, which filters out the rows that already exist, so a run that changes nothing
writes nothing, not even a consumed identity value. Both are the fast path, which waits
on a lock only briefly (page_settings' lock_timeout). A page it could not write (a task
a racing writer made first, refused by task_dispatch_identity; a duty row a tenant's
open transaction holds; a duty deleted or moved since the page was read) is written
again by insert_careful, which takes each duty as it stands, skips what a tenant holds
instead of waiting for it, and reports it; a bulk page that met a lock sends it only the
duties another transaction holds, and COPYs the rest. The dispatcher never updates or
deletes a task."""

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, TypeVar

from psycopg import errors as pg_errors
from psycopg.types.string import BytesBinaryDumper
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from rota.pipelines.dispatch.planner import Plan
from rota.resources.database.queries import queries

log = logging.getLogger(__name__)


T = TypeVar("T")
DEADLOCK_RETRIES = 8
QUERIES = queries("rota.pipelines.dispatch")
_PERIOD_TYPES = ["int4", "int4", "text", "date", "date", "date", "text", "text"]
# The workspace goes as the page read it, uuid's 16 bytes in binary (reading.py), which is
# bytea's binary form too: the server reads each COPY field by its column's type.
_SLICE_TYPES = ["int8", "int4", "int4", "int4", "int8", "bytea"]
_TASK_TYPES = ["int8", "bytea", "text", "date", "date", "date"]
# A partition's share of task_dispatch_identity is named after it (migration 0009), and a
# duplicate is reported under the partition's name.
IDENTITY = "task_dispatch_identity"
# How long a fast-path page waits on a lock before it is written again by insert_careful.
# A tenant's ordinary write holds a duty row for milliseconds; one that holds it longer
# costs the page a second write, never the run a wait.
FAST_PATH_LOCK_WAIT = "100ms"
# How long a run goes on trying to move the marks another run's pages kept back, while
# pages of its frequency keep being written (move_deferred_marks): a backfill's page of a
# year of daily tasks holds its duties for tens of seconds.
MARKS_WAIT = 120.0


def _retrying_deadlocks(work: Callable[[], T]) -> tuple[T, int]:
    """Run one page's transaction, retrying it when PostgreSQL picks it as a deadlock
    victim; returns its result and how many retries it took.

    Inserts go in identity order, which keeps racing writers from deadlocking on the
    unique index; the retry covers what ordering cannot (the duty updates)."""
    for attempt in range(DEADLOCK_RETRIES):
        try:
            return work(), attempt
        except (DBAPIError, pg_errors.Error) as error:  # through SQLAlchemy, or the page's raw cursor
            if not _retryable(error) or attempt == DEADLOCK_RETRIES - 1:
                raise
            log.warning("page write was a deadlock victim; retrying (attempt %d)", attempt + 2)
            time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
    raise AssertionError("unreachable")


def _retryable(error: Exception) -> bool:
    """Whether PostgreSQL chose the page as a deadlock's or a serialization's victim. A
    function of its own, so that no local of the retrying frame holds the error while it
    propagates: its traceback leads back to that frame, and the cycle would keep the page's
    plan until the end of the dispatch, which runs with the collector off (run.py)."""
    cause = error.orig if isinstance(error, DBAPIError) else error
    return isinstance(cause, (pg_errors.DeadlockDetected, pg_errors.SerializationFailure))


class _ChangedSinceRead(Exception):
    """The bulk path's UPDATE moved fewer duties than the page offers: some were deleted,
    or moved to another frequency or workspace, since the page was read."""


class _DutyHeld(Exception):
    """The bulk path's UPDATE met a duty row another transaction holds (a tenant's open
    UPDATE or FOR UPDATE) for longer than FAST_PATH_LOCK_WAIT."""


_FAST_PATH_FAILURES = (pg_errors.UniqueViolation, _ChangedSinceRead, _DutyHeld, pg_errors.LockNotAvailable)


@dataclass
class PageWritten:
    # Per duty, the tasks made; None on the bulk path, which made every slice whole.
    created: dict[int, int] | None
    created_by_period: dict[str, int]
    deadlocks_retried: int = 0
    copied: bool = False
    written_again: bool = False
    # (duty, period) of the tasks not made because another transaction held the duty's row
    # against new references (FOR UPDATE, an uncommitted DELETE). And the marks that stayed
    # where they were because another transaction held their rows (an open UPDATE, FOR
    # SHARE, another run's page): per duty, the last_dispatched_period it would have taken.
    held: list[tuple[int, str]] = field(default_factory=list)
    deferred: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Page:
    """What every transaction writing one page's plan (or a part of its duties) needs."""
    engine: Engine
    frequency: str
    used: dict[int, tuple[int, int]]
    keys: list[str]


def write_plan(engine: Engine, page_plan: Plan, frequency: str) -> PageWritten:
    """Write one page's tasks, in one transaction; or in two when a bulk page met a duty row
    another transaction holds: the others' tasks first, then the held duties' (the first
    commits even if the second fails, and the next run finds its tasks)."""
    if not page_plan.slices:
        return PageWritten({}, {})

    used = {group: span for group, span in enumerate(page_plan.used) if span}
    keys = sorted({page_plan.groups[group][index][0]
                   for group, (first, last) in used.items() for index in range(first, last + 1)})
    if not page_plan.after_dispatched and _all_offered_exist(engine, page_plan, keys):
        return PageWritten({}, {})
    page = _Page(engine, frequency, used, keys)

    try:
        written, retried = _retrying_deadlocks(lambda: _write(page, page_plan, careful=False))
        written.deadlocks_retried = retried
        return written
    except _FAST_PATH_FAILURES as error:
        if (why := _why_written_again(error)) is None:
            raise
        if isinstance(error, _DutyHeld):
            try:
                return _write_around_held(page, page_plan)
            except _FAST_PATH_FAILURES as again:
                if (why := _why_written_again(again)) is None:
                    raise
    log.info("writing the page again, as its duties stand and without waiting on a lock: %s", why)
    written, retried = _retrying_deadlocks(lambda: _write(page, page_plan, careful=True))
    written.written_again = True
    written.deadlocks_retried = retried
    return written


def _write(page: _Page, plan: Plan, careful: bool) -> PageWritten:
    """One transaction: the fast path (the bulk path's UPDATE and COPY, or insert_new), or
    insert_careful."""
    with page.engine.begin() as conn:
        cursor = _page_cursor(conn)
        bounds = _offer(cursor, page, plan, "0" if careful else FAST_PATH_LOCK_WAIT)
        if careful:
            return _written_carefully(cursor.execute(QUERIES["insert_careful"], bounds).fetchall())
        if plan.after_dispatched:
            cursor.execute(QUERIES["advance_settings"])
            try:
                advanced = cursor.execute(QUERIES["advance_new"], bounds).rowcount
            except pg_errors.LockNotAvailable as error:
                raise _DutyHeld from error
            return _copy_tasks(cursor, plan, advanced)
        rows = cursor.execute(QUERIES["insert_new"], bounds).fetchall()
        return PageWritten({duty_id: n for duty_id, key, n in rows if key is None},
                           {key: n for duty_id, key, n in rows if key is not None})


def _write_around_held(page: _Page, page_plan: Plan) -> PageWritten:
    """A bulk page whose UPDATE met a held duty row, written again: the duties no other
    transaction holds are locked and written on the bulk path, and only those it holds go
    to insert_careful, in a transaction of their own. Written whole by insert_careful, a
    page of 20,000 daily duties took a second more than its COPY (docs/perf.md)."""
    def free_part() -> tuple[Plan, set[int]]:
        with page.engine.begin() as conn:
            cursor = _page_cursor(conn)
            bounds = _offer(cursor, page, page_plan, FAST_PATH_LOCK_WAIT)
            cursor.execute(QUERIES["advance_settings"])
            held = {duty_id for (duty_id,) in cursor.execute(QUERIES["offer_only_free"], bounds).fetchall()}
            free = replace(page_plan, slices=[s for s in page_plan.slices if s.duty_id not in held])
            if free.slices:
                # Its counts are the whole page's; the free part's are counted below.
                _copy_tasks(cursor, free, cursor.execute(QUERIES["advance_new"], bounds).rowcount)
            return free, held

    (free, held), retried = _retrying_deadlocks(free_part)
    log.info("writing the page around %d of its duties, which another transaction holds", len(held))
    written = PageWritten({s.duty_id: s.last - s.first + 1 for s in free.slices},
                          dict(Counter(period[0] for _, period in free.tasks())),
                          deadlocks_retried=retried, copied=bool(free.slices), written_again=True)
    if held:
        rest, retried = _retrying_deadlocks(lambda: _write(
            page, replace(page_plan, slices=[s for s in page_plan.slices if s.duty_id in held]), careful=True))
        written.created.update(rest.created)
        written.created_by_period = dict(Counter(written.created_by_period) + Counter(rest.created_by_period))
        written.held, written.deferred = rest.held, rest.deferred
        written.deadlocks_retried += retried
    return written


def _why_written_again(error: Exception) -> str | None:
    """Why the fast path's failure sends the page to insert_careful; None for a unique
    violation other than task_dispatch_identity's, which is no race and must propagate."""
    if isinstance(error, pg_errors.UniqueViolation):
        if not (error.diag.constraint_name or "").startswith(IDENTITY):  # the page's own cursor is psycopg's
            return None
        return "some of its tasks exist already (a racing writer's, or behind marks a lock kept back)"
    if isinstance(error, _ChangedSinceRead):
        return "some of its duties were deleted or moved since the page was read"
    return f"a row it needs stayed locked by another transaction for {FAST_PATH_LOCK_WAIT}"


def _page_cursor(conn):
    """The psycopg cursor a page's transaction writes through. Its COPYs' bytea fields (the
    workspaces) are dumped by psycopg's compiled dumper of bytes: the one psycopg keeps for
    bytea by default is dbapi20's, which unwraps a `Binary` in Python, a call into the
    interpreter for each of the millions of fields a night writes (docs/perf.md). Registered
    for the PostgreSQL type alone, on this cursor alone: the pooled connection keeps psycopg's
    defaults."""
    cursor = conn.connection.driver_connection.cursor()
    cursor.adapters.register_dumper(None, BytesBinaryDumper)
    return cursor


def _offer(cursor, page: _Page, plan: Plan, lock_timeout: str) -> dict:
    """Begin a page's transaction: its settings, its partitions, and its plan copied into
    the temporary tables. Returns the bounds its statements take."""
    _hold_page_lock(cursor, page.frequency)
    cursor.execute(QUERIES["page_settings"], {"lock_timeout": lock_timeout})
    cursor.execute(QUERIES["ensure_partitions"], [page.keys])
    cursor.execute(QUERIES["create_offered_period"])
    cursor.execute(QUERIES["create_offered_duty"])
    with cursor.copy(QUERIES["copy_offered_periods"]) as copy:
        copy.set_types(_PERIOD_TYPES)
        for group, (first, last) in page.used.items():
            periods, span = plan.groups[group], plan.spans[group] or (None, None)
            for index in range(first, last + 1):
                copy.write_row((group, index, *periods[index], *span))
    with cursor.copy(QUERIES["copy_offered_duties"]) as copy:
        copy.set_types(_SLICE_TYPES)
        for s in plan.slices:
            copy.write_row((s.duty_id, s.group, s.first, s.last, s.version, s.workspace))
    # The page's frequency and id range let the duty lookups use duty_dispatch_scan_idx.
    return {"frequency": page.frequency, "first_id": plan.slices[0].duty_id, "last_id": plan.slices[-1].duty_id,
            "keys": page.keys}


def _written_carefully(rows: list[tuple]) -> PageWritten:
    written = PageWritten({}, {})
    for duty_id, key, n, waiting in rows:
        if waiting == "held":
            written.held.append((duty_id, key))
        elif waiting == "deferred":
            written.deferred[duty_id] = key
        elif key is None:
            written.created[duty_id] = n
        else:
            written.created_by_period[key] = n
    return written


def move_deferred_marks(engine: Engine, frequency: str, wanted: dict[int, str]) -> set[int]:
    """Move the marks insert_careful deferred (`wanted`: per duty, the last_dispatched_period
    it would have taken), once the run's own pages are written. Returns the duties whose
    rows are still held: by a tenant, or by another run's page past MARKS_WAIT.

    Another run's page that held such a duty's row moved its mark only to that page's own
    newest task: a backfill's older month, say, while this run made the current one. Left
    there, the mark would stay behind the duty's newest task for good (SPEC §2), since a
    run that finds every offered task made writes nothing. A page holds its duties' rows
    only for its own transaction, so this waits for it, retrying without waiting on any
    row. A row still held while no page of the frequency is being written (pages_paused:
    every page holds its frequency's row of dispatch_page_lock, which no tenant can lock)
    is a tenant's: reported, and moved by the first run that offers the duty a task after
    the tenant lets go. MARKS_WAIT bounds the wait while other runs' pages keep coming."""
    deadline, pause = time.monotonic() + MARKS_WAIT, 0.01
    while True:
        with engine.begin() as conn:
            cursor = conn.connection.driver_connection.cursor()
            alone = _pages_paused(cursor, frequency)
            ids = sorted(wanted)
            held = {duty_id for (duty_id,) in cursor.execute(QUERIES["move_deferred_marks"], {
                "frequency": frequency, "duty_ids": ids, "keys": [wanted[d] for d in ids]}).fetchall()}
        if not held or alone or time.monotonic() >= deadline:
            return held
        wanted = {duty_id: wanted[duty_id] for duty_id in held}
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _hold_page_lock(cursor, frequency: str) -> None:
    if cursor.execute(QUERIES["hold_page_lock"], {"frequency": frequency}).fetchone() is None:
        raise _missing_page_lock(frequency)


def _pages_paused(cursor, frequency: str) -> bool:
    """Whether no page of the frequency is being written, by any run, in which case none
    begins until the cursor's transaction ends. If one is, the transaction holds the page
    lock as a page does, since it too locks duty rows: another run finding the pages
    paused must not take those for a tenant's."""
    cursor.execute("SAVEPOINT pages_paused")
    try:
        if cursor.execute(QUERIES["pages_paused"], {"frequency": frequency}).fetchone() is None:
            raise _missing_page_lock(frequency)
    except pg_errors.LockNotAvailable:
        cursor.execute("ROLLBACK TO SAVEPOINT pages_paused")
        _hold_page_lock(cursor, frequency)
        return False
    return True


def _missing_page_lock(frequency: str) -> RuntimeError:
    return RuntimeError(f"dispatch_page_lock has no row for {frequency!r}, which every page of it locks: "
                        "the database is not at rota's newest migration (run `rota migrate`)")


def _all_offered_exist(engine: Engine, page_plan: Plan, keys: list[str]) -> bool:
    """Whether every task the page offers exists already (a backfill run again), read
    without a transaction that could write: the write would then insert nothing and move
    no mark (a duty given no new task is not written), so it is not begun, and an identical
    run writes nothing at all, not even a transaction id or a temporary table's WAL."""
    slices = page_plan.slices
    with engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()
        missing = cursor.execute(QUERIES["missing_offered"], {
            "duty_ids": [s.duty_id for s in slices],
            "first_keys": [page_plan.groups[s.group][s.first][0] for s in slices],
            "last_keys": [page_plan.groups[s.group][s.last][0] for s in slices],
            "sizes": [s.last - s.first + 1 for s in slices],
            "keys": keys}).fetchone()[0]
        conn.rollback()
    return missing == 0


def _copy_tasks(cursor, page_plan: Plan, advanced: int) -> PageWritten:
    """The bulk path's COPY: the tasks of every duty of the page, in identity order, each
    with the workspace the page read. Only if advance_new moved every one of them: its row
    locks, and its check that each duty still has the workspace the page read, are all
    that vouch for these tasks (page_settings), so a page it did not move whole goes to
    insert_careful instead."""
    if advanced != len(page_plan.slices):
        raise _ChangedSinceRead
    with cursor.copy(QUERIES["copy_tasks"]) as copy:
        copy.set_types(_TASK_TYPES)
        write_row = copy.write_row
        for s, period in page_plan.tasks():
            write_row((s.duty_id, s.workspace, *period))
    return PageWritten(None, {key: n for (key, outcome), n in page_plan.periods.items() if outcome == "offered"},
                       copied=True)


def ensure_partitions(engine: Engine, keys: list[str]) -> None:
    """Make the task partitions these keys need, in a transaction of their own: a run
    makes those of its range and of the period after it before its first page, so pages
    rarely wait on the lock that serialises the making (task's SHARE UPDATE EXCLUSIVE)."""
    with engine.begin() as conn:
        conn.exec_driver_sql(QUERIES["ensure_partitions"], (sorted(set(keys)),))
