"""One frequency's dispatch: duties read in pages, each planned and written while the
next is read, and what it did counted per timezone and per period."""

import gc
import os
import threading
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterator

from psycopg import errors as pg_errors
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from rota.pipelines.dispatch.planner import DutyRow, Mode, Plan, plan
from rota.pipelines.dispatch.reading import read_pages
from rota.pipelines.dispatch.writing import PageWritten, ensure_partitions, move_deferred_marks, write_plan
from rota.pipelines.periods.calendar import Period, following, open_range
from rota.resources.database.engine import DEFAULT_WRITERS
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.dispatch")

DEFAULT_PAGE_SIZE = 20_000

# gc.disable and gc.enable act on the whole process, and dispatches may run at once in one
# (on threads of their own): they share the switch, counted.
_collector_lock = threading.Lock()
_collector_holders = 0
_host_turned_off = False


def _collector_after_fork() -> None:
    """A child forked while dispatches ran runs none of them: it starts with the collector
    as the process had it before the first, and with a lock no thread of its own holds."""
    global _collector_lock, _collector_holders
    _collector_lock = threading.Lock()
    if _collector_holders and not _host_turned_off:
        gc.enable()
    _collector_holders = 0


os.register_at_fork(after_in_child=_collector_after_fork)


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
    # (timezone, outcome) -> count; outcomes: created, existing, held, skipped, outside_window
    counts: Counter = field(default_factory=Counter)
    # (period_key, outcome) -> count, the same outcomes per requested period
    periods: Counter = field(default_factory=Counter)
    unplannable: dict[int, str] = field(default_factory=dict)
    deadlocks_retried: int = 0
    # Pages written by the bulk path, and pages written again around tasks that existed.
    pages_copied: int = 0
    pages_written_again: int = 0
    # Duties another transaction held against new references: their tasks wait for the
    # first run after it ends (their periods' tasks are counted `held`). And duties whose
    # tasks were made but whose marks a tenant's lock kept back (writing.py's
    # move_deferred_marks moves those another run's page kept back).
    held: set[int] = field(default_factory=set)
    marks_deferred: set[int] = field(default_factory=set)

    def total(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.counts.items() if o == outcome)

    def for_period(self, key: str) -> dict[str, int]:
        return {outcome: self.periods[(key, outcome)]
                for outcome in ("created", "existing", "held", "skipped", "outside_window")}

    def by_timezone(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for (timezone, outcome), n in sorted(self.counts.items()):
            if n:
                table.setdefault(timezone, {})[outcome] = n
        return table


def _count_written(report: DispatchReport, page_plan: Plan, written: PageWritten) -> None:
    made: Counter = Counter()
    if written.created is None:
        made.update(page_plan.offered)
    else:
        for duty_id, n in written.created.items():
            made[page_plan.timezone_of[duty_id]] += n
    held, held_by_period = _held(page_plan, written.held)
    for timezone, offered in page_plan.offered.items():
        report.counts[(timezone, "created")] += made[timezone]
        report.counts[(timezone, "held")] += held[timezone]
        report.counts[(timezone, "existing")] += offered - made[timezone] - held[timezone]
    for (key, outcome), n in page_plan.periods.items():
        if outcome == "offered":
            made = written.created_by_period.get(key, 0)
            report.periods[(key, "created")] += made
            report.periods[(key, "held")] += held_by_period[key]
            report.periods[(key, "existing")] += n - made - held_by_period[key]
        else:
            report.periods[(key, outcome)] += n
    report.held.update(duty_id for duty_id, _ in written.held)
    report.deadlocks_retried += written.deadlocks_retried
    report.pages_copied += written.copied
    report.pages_written_again += written.written_again


def _held(page_plan: Plan, pairs: list[tuple[int, str]]) -> tuple[Counter, Counter]:
    """The held tasks per timezone and per period."""
    by_timezone = Counter(page_plan.timezone_of[duty_id] for duty_id, _ in pairs)
    return by_timezone, Counter(key for _, key in pairs)


def scheduled_reach(engine: Engine, frequency: str, as_of: datetime) -> Period:
    """The last period a scheduled run at `as_of` may dispatch: the one the longest active
    lead reaches from the latest local date on Earth."""
    with engine.connect() as conn:
        max_lead = conn.exec_driver_sql(QUERIES["max_lead"], (frequency,)).scalar_one()
        conn.rollback()
    return open_range(frequency, as_of, max_lead)[1]


@contextmanager
def _collector_off() -> Iterator[None]:
    """Keep the garbage collector from running while this dispatch does.

    Pages make millions of short-lived objects that hold no cycle (rows, slices, tuples
    of dates and keys), and the collector's passes over them found nothing to free and
    cost a fifth of the dispatch's Python, even with every older object frozen
    (docs/perf.md). Cyclic garbage that other threads of the process make meanwhile waits
    for the end of the run, and the dispatch's own error paths make none (writing.py's
    _retryable). Dispatches running at once share the switch: only the last to end turns
    the collector back on, since one ending earlier would hand it the pages the others
    still run. A process whose collector is off when the first of them starts keeps it
    off."""
    global _collector_holders, _host_turned_off
    with _collector_lock:
        if not _collector_holders:
            _host_turned_off = not gc.isenabled()
            gc.disable()
        _collector_holders += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_holders -= 1
            if not _collector_holders and not _host_turned_off:
                gc.enable()


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
    marks_wanted: dict[int, str] = {}

    def settle_oldest() -> None:
        nonlocal at_page
        at_page, page_plan, writing = in_flight.popleft()
        written = writing.result()
        _count_written(report, page_plan, written)
        marks_wanted.update(written.deferred)

    try:
        with (_collector_off(),
              ThreadPoolExecutor(max_workers=writers, thread_name_prefix=f"dispatch-{frequency}") as pool,
              ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"read-{frequency}") as reader):
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
        if marks_wanted:
            report.marks_deferred = move_deferred_marks(engine, frequency, marks_wanted)
    except (OperationalError, pg_errors.OperationalError) as error:  # through SQLAlchemy, or a raw cursor
        raise DatabaseWentAway(
            f"{frequency} dispatch lost the database during page {at_page} "
            f"({report.total('created')} tasks created in the pages written before it, which stay; "
            f"the next run creates the rest): {getattr(error, 'orig', error)}"
        ) from error
    return report
