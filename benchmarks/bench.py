"""`python -m benchmarks`: every benchmark case, each a ratio against a baseline measured in the
same run, median of at least three repetitions. Builds its own data in databases of
its own on the embedded PostgreSQL (or ROTA_DATABASE_URL's server)."""

import glob
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import psycopg
from psycopg import sql
from sqlalchemy import Engine, create_engine, text

from benchmarks.data import load_duties, reset_dispatch, settle, workspace_of
from benchmarks.queue_baselines import CONCURRENCY
from benchmarks.queue_floor import produce
from rota.pipelines.dispatch.planner import Mode, plan
from rota.pipelines.dispatch.reading import read_pages
from rota.pipelines.dispatch.run import DEFAULT_PAGE_SIZE, dispatch
from rota.pipelines.periods.calendar import open_range, period_containing, periods_between
from rota.pipelines.periods.history import OVERRIDE as HISTORY_OVERRIDE
from rota.pipelines.queue.enqueue import enqueue_scheduled, enqueue_scheduled_many
from rota.pipelines.queue.jobs import register_job
from rota.resources.database import migrate as migrations
from rota.resources.database.engine import DEFAULT_WRITERS
from rota.resources.database.schema import FREQUENCIES
from rota.resources.database.server import (
    PROJECT_ROOT,
    driver_url,
    libpq_url,
    resolve_database_url,
    rota_home,
    with_database,
)

AS_OF = datetime(2026, 12, 2, 12, tzinfo=timezone.utc)
COPY_TASK = ("COPY task_copy (duty_id, period_key, workspace_id, period_start, due_date, visible_from) "
             "FROM STDIN (FORMAT BINARY)")


@dataclass
class Case:
    name: str
    value: float
    baseline: float
    ratio: float
    target: str
    passed: bool
    unit: str = "s"
    note: str = ""

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{self.name:<20} {self.value:>10.3f}{self.unit:<3} baseline {self.baseline:>10.3f}{self.unit:<3} "
                f"ratio {self.ratio:>7.2f}  target {self.target:<8} {verdict}  {self.note}")


def timed(work: Callable[[], object], before: Callable[[], object] | None = None) -> float:
    """Seconds `work` took, after `before`, untimed."""
    if before:
        before()
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def median_time(work: Callable[[], object], repeat: int, before: Callable[[], object] | None = None) -> float:
    return statistics.median(timed(work, before) for _ in range(repeat))


def fresh_database(server_url: str, name: str) -> str:
    with psycopg.connect(libpq_url(with_database(server_url, "postgres")), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(server_url, name)
    migrations.upgrade(url)
    return url


def scheduled_dispatch(engine: Engine) -> int:
    """The scheduled dispatch of every frequency, as the five schedules' runs do it."""
    created = 0
    for frequency in FREQUENCIES:
        first, last = open_range(frequency, AS_OF, 30)
        report = dispatch(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=AS_OF,
                          requested=periods_between(first, last))
        if report.unplannable:
            raise RuntimeError(f"{frequency}: unplannable {len(report.unplannable)}")
        created += report.total("created")
    return created


def planned_rows(engine: Engine, frequency_ranges: dict[str, tuple[Mode, list]]) -> list[tuple]:
    """The task rows a dispatch writes, complete with each duty's workspace, for the COPY."""
    with engine.connect() as conn:
        workspace_of = dict(conn.execute(text("SELECT id, workspace_id FROM duty")).all())
    rows = []
    for frequency, (mode, requested) in frequency_ranges.items():
        for page in read_pages(engine, frequency, DEFAULT_PAGE_SIZE):
            page_plan = plan(page, frequency=frequency, mode=mode, as_of=AS_OF, requested=requested)
            for s, (key, *dates) in page_plan.tasks():
                rows.append((s.duty_id, key, workspace_of[s.duty_id], *dates))
    return rows


def copy_baseline(engine: Engine, rows: list[tuple]) -> tuple[Callable[[], None], Callable[[], None]]:
    def prepare() -> None:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS task_copy"))
            conn.execute(text("CREATE TABLE task_copy (LIKE task INCLUDING ALL)"))
        settle(engine)

    def work() -> None:
        with engine.begin() as conn:
            cursor = conn.connection.driver_connection.cursor()
            with cursor.copy(COPY_TASK) as copy:
                copy.set_types(["int8", "text", "uuid", "date", "date", "date"])
                for row in rows:
                    copy.write_row(row)

    return prepare, work


def floor_baseline(engine: Engine, rows: list[tuple]) -> tuple[Callable[[], None], Callable[[], None]]:
    """The least any correct dispatcher must do: write the tasks (the COPY) and move each
    duty's last_dispatched_period in one set-based UPDATE."""
    newest: dict[int, str] = {}
    for row in rows:
        newest[row[0]] = max(newest.get(row[0], row[1]), row[1])
    prepare_copy, copy = copy_baseline(engine, rows)

    def prepare() -> None:
        prepare_copy()
        reset_dispatch(engine)

    def work() -> None:
        copy()
        with engine.begin() as conn:
            conn.execute(text("UPDATE duty d SET last_dispatched_period = n.key "
                              "FROM unnest(CAST(:ids AS bigint[]), CAST(:keys AS text[])) AS n (id, key) "
                              "WHERE d.id = n.id"), {"ids": list(newest), "keys": list(newest.values())})

    return prepare, work


def parallel_floor_baseline(engine: Engine, rows: list[tuple],
                            writers: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """The floor written the way the dispatch writes: the duties in pages of the dispatch's
    size, in id order, each page's tasks COPYed and its duties' last_dispatched_period
    moved in one transaction, `writers` pages at once on connections of their own."""
    by_duty: dict[int, list[tuple]] = {}
    for row in rows:
        by_duty.setdefault(row[0], []).append(row)
    duties = sorted(by_duty)
    pages = [duties[at:at + DEFAULT_PAGE_SIZE] for at in range(0, len(duties), DEFAULT_PAGE_SIZE)]
    prepare_copy, _ = copy_baseline(engine, rows)

    def prepare() -> None:
        prepare_copy()
        reset_dispatch(engine)

    def write(page: list[int]) -> None:
        with engine.begin() as conn:
            cursor = conn.connection.driver_connection.cursor()
            with cursor.copy(COPY_TASK) as copy:
                copy.set_types(["int8", "text", "uuid", "date", "date", "date"])
                for duty_id in page:
                    for row in by_duty[duty_id]:
                        copy.write_row(row)
            conn.execute(text("UPDATE duty d SET last_dispatched_period = n.key "
                              "FROM unnest(CAST(:ids AS bigint[]), CAST(:keys AS text[])) AS n (id, key) "
                              "WHERE d.id = n.id"),
                         {"ids": page, "keys": [max(row[1] for row in by_duty[duty_id]) for duty_id in page]})

    def work() -> None:
        with ThreadPoolExecutor(max_workers=writers) as pool:
            list(pool.map(write, pages))

    return prepare, work


def fingerprint(engine: Engine) -> dict:
    from tests.helpers import database_fingerprint

    result = database_fingerprint(engine)
    result.pop("task_copy", None)
    return result


def _baselines(engine: Engine) -> tuple[float, float, float, int]:
    """One round of the COPY, the floor and the parallel floor, each timed once, and how
    many tasks they wrote. Each is made just before it is timed, and their rows are gone
    once this returns: nothing is timed beside millions of Python objects it never made,
    which every full pass of the garbage collector walks (measured at a million duties: a
    dispatch took 18 s beside them, 15 s without). The floor's copy is dropped, so the
    dispatch is timed beside the tables it writes and no other."""
    ranges = {f: (Mode.SCHEDULED, periods_between(*open_range(f, AS_OF, 30))) for f in FREQUENCIES}
    reset_dispatch(engine)
    rows = planned_rows(engine, ranges)
    times = []
    for baseline in (copy_baseline, floor_baseline, partial(parallel_floor_baseline, writers=DEFAULT_WRITERS)):
        prepare, work = baseline(engine, rows)
        times.append(timed(work, prepare))
        del prepare, work
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE task_copy"))
    copy_time, floor_time, parallel_time = times
    return copy_time, floor_time, parallel_time, len(rows)


def case_dispatch(engine: Engine, repeat: int) -> list[Case]:
    """The first dispatch and the one after it (which must write nothing) against their
    baselines, in rounds: each round times every baseline once, then the dispatch, then it
    again. This machine's speed drifts over minutes (the same dispatch on one tree and one
    database took 19 to 24 s in six runs in a row, its own Python CPU 12 to 15 s), so
    timing each side's repetitions in a block of its own would put the drift into the
    ratio."""
    rounds = []
    unchanged = True
    for at in range(repeat):
        copy_time, floor_time, parallel_floor_time, tasks = _baselines(engine)
        first = timed(lambda: scheduled_dispatch(engine), lambda: reset_dispatch(engine))
        before = fingerprint(engine) if at == repeat - 1 else None
        noop = timed(lambda: scheduled_dispatch(engine))
        if before is not None:
            unchanged = fingerprint(engine) == before
        rounds.append((copy_time, floor_time, parallel_floor_time, first, noop))
    copy_time, floor_time, parallel_floor_time, first, noop = (statistics.median(side) for side in zip(*rounds))
    return [
        Case("dispatch_first", first, copy_time, first / copy_time, "<= 2.0", first / copy_time <= 2.0,
             note=f"{tasks:,} tasks"),
        Case("dispatch_vs_floor", first, floor_time, first / floor_time, "<= 1.5", first / floor_time <= 1.5,
             note="baseline: the COPY plus one UPDATE of last_dispatched_period"),
        Case("dispatch_vs_parallel_floor", first, parallel_floor_time, first / parallel_floor_time, "<= 1.2",
             first / parallel_floor_time <= 1.2,
             note=f"baseline: that floor in the dispatch's pages, {DEFAULT_WRITERS} at once"),
        Case("dispatch_noop", noop, copy_time, noop / copy_time, "<= 0.5", noop / copy_time <= 0.5 and unchanged,
             note="zero writes" if unchanged else "WROTE SOMETHING"),
    ]


def case_task_duty_check(engine: Engine, repeat: int) -> list[Case]:
    """task_duty_fkey is triggers, which the dispatcher skips for the duties it holds, and
    not a declarative foreign key, which would check every task it inserts (issue 40): the
    hand-made part earns its place only while it saves more than a tenth of a first
    dispatch. The two take turns, as case_dispatch's rounds do; the key is added while
    task is empty, so checking it costs nothing untimed."""
    def with_foreign_key() -> None:
        reset_dispatch(engine)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE task DISABLE TRIGGER task_duty_fkey_insert"))
            conn.execute(text("ALTER TABLE task ADD CONSTRAINT bench_task_duty_fk FOREIGN KEY (duty_id, workspace_id) "
                              "REFERENCES duty (id, workspace_id)"))

    def with_triggers() -> None:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE task DROP CONSTRAINT IF EXISTS bench_task_duty_fk"))
            conn.execute(text("ALTER TABLE task ENABLE TRIGGER task_duty_fkey_insert"))

    turns = []
    try:
        for _ in range(repeat):
            triggers = timed(lambda: scheduled_dispatch(engine), lambda: reset_dispatch(engine))
            turns.append((triggers, timed(lambda: scheduled_dispatch(engine), with_foreign_key)))
            with_triggers()
    finally:
        with_triggers()
    triggers, foreign_key = (statistics.median(side) for side in zip(*turns))
    ratio = triggers / foreign_key
    return [Case("task_duty_triggers", triggers, foreign_key, ratio, "<= 0.91", ratio <= 1 / 1.1,
                 note="baseline: the first dispatch under a declarative foreign key instead")]


def _wal_position(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")).scalar_one()


def _add_history_day(engine: Engine, day: date) -> None:
    """One day's tasks for every duty, inserted as that night's dispatch inserts them."""
    key = day.isoformat()
    with engine.begin() as conn:
        conn.execute(text("SELECT rota_ensure_task_partitions(ARRAY[CAST(:k AS text)])"), {"k": key})
        conn.execute(text(
            "INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from, "
            "created_at, updated_at) SELECT id, workspace_id, :k, :d, :d, :d, :d, :d FROM duty ORDER BY id"),
            {"k": key, "d": day})
        conn.execute(text("UPDATE duty SET last_dispatched_period = :k"), {"k": key})


def _night(engine: Engine, night: date) -> tuple[float, int, int]:
    """The scheduled daily dispatch at 00:05 UTC of `night`, after a checkpoint (so every
    page it touches first pays its full-page image, as a night does): seconds, WAL
    bytes, tasks made."""
    settle(engine)
    as_of = datetime(night.year, night.month, night.day, 0, 5, tzinfo=timezone.utc)
    wal = _wal_position(engine)
    started = time.perf_counter()
    report = dispatch(engine, frequency="daily", mode=Mode.SCHEDULED, as_of=as_of,
                      requested=periods_between(*open_range("daily", as_of, 30)))
    elapsed = time.perf_counter() - started
    return elapsed, _wal_position(engine) - wal, report.total("created")


def case_dispatch_after_a_year(server_url: str, duties: int, history_days: int, repeat: int) -> list[Case]:
    """The night after `history_days` days of history against the same night after one,
    on a database of its own with the same duties, the two taken in turns: the history
    takes a quarter of an hour to build, and this machine's speed drifts over less: the
    one-day nights timed before it carried the drift into the ratio (docs/perf.md). The
    nights are the last days of a partition's range (7, 8 and more days of daily tasks
    already in the hot partition), the worst place for the layout."""
    url = fresh_database(server_url, "rota_bench_year")
    engine = create_engine(driver_url(url))
    load_duties(engine, duties, frequencies=[("daily", 1)], max_lead=0, zones=["UTC"])
    short = create_engine(driver_url(fresh_database(server_url, "rota_bench_day")))
    load_duties(short, duties, frequencies=[("daily", 1)], max_lead=0, zones=["UTC"])
    nights = [date(2026, 12, 8) - timedelta(days=repeat - 1 - n) for n in range(repeat)]
    started = time.perf_counter()
    for n in range(history_days, 0, -1):
        _add_history_day(engine, nights[0] - timedelta(days=n))
    # A year of real nights has autovacuum between them; 365 back-to-back updates of every
    # duty do not, and would time duty's dead versions rather than task's history.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (ANALYZE) task, duty"))
        size = conn.execute(text(
            "SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = 'task'::regclass"
        )).scalar_one()
    built = time.perf_counter() - started
    one_day, year = [], []
    try:
        for at, night in enumerate(nights):
            reset_dispatch(short)
            _add_history_day(short, night - timedelta(days=1))
            # Each side goes first in turn: the drift is there within a round too.
            for side, nights_of_side in ((short, one_day), (engine, year))[::1 if at % 2 else -1]:
                nights_of_side.append(_night(side, night))
    finally:
        short.dispose()
        engine.dispose()
    if any(made != duties for *_, made in one_day + year):
        raise RuntimeError(f"a night made {[made for *_, made in one_day + year]} tasks, not {duties:,}")
    time_short, wal_short = (statistics.median(x[i] for x in one_day) for i in (0, 1))
    time_long, wal_long = (statistics.median(x[i] for x in year) for i in (0, 1))
    history = f"{duties:,} daily duties, {history_days} days of history ({size / 2**30:.1f} GB, built in {built:.0f} s)"
    return [
        Case("dispatch_after_a_year", time_long, time_short, time_long / time_short, "<= 1.2",
             time_long / time_short <= 1.2,
             note=f"{history}; {1e6 * time_long / duties:.1f} against {1e6 * time_short / duties:.1f} us a task"),
        Case("wal_after_a_year", wal_long / 2**20, wal_short / 2**20, wal_long / wal_short, "<= 1.5",
             wal_long / wal_short <= 1.5, unit="MB", note="WAL of the night, by pg_current_wal_lsn()"),
    ]


def case_backfill(server_url: str, duties: int, repeat: int) -> list[Case]:
    url = fresh_database(server_url, "rota_bench_backfill")
    engine = create_engine(driver_url(url))
    load_duties(engine, duties, frequencies=[("monthly", 1)])
    months = periods_between(period_containing("monthly", datetime(2025, 11, 1).date()),
                             period_containing("monthly", datetime(2026, 11, 1).date()))
    rows = planned_rows(engine, {"monthly": (Mode.BACKFILL, months)})
    prepare, work = copy_baseline(engine, rows)
    copy_time = median_time(work, repeat, prepare)

    def backfill() -> None:
        report = dispatch(engine, frequency="monthly", mode=Mode.BACKFILL, as_of=AS_OF, requested=months)
        if report.unplannable:
            raise RuntimeError("backfill incomplete")

    elapsed = median_time(backfill, repeat, lambda: reset_dispatch(engine))
    before = fingerprint(engine)
    backfill()
    unchanged = fingerprint(engine) == before
    engine.dispose()
    ratio = elapsed / copy_time
    return [Case("backfill_13_months", elapsed, copy_time, ratio, "<= 2.5", ratio <= 2.5 and unchanged,
                 note=f"{len(rows):,} tasks; again: " + ("zero writes" if unchanged else "WROTE SOMETHING"))]


def naive_plan(duties, frequency: str) -> list[tuple]:
    """The straightforward planner: one pendulum conversion per duty."""
    import pendulum

    out = []
    for duty in duties:
        local = pendulum.instance(AS_OF).in_timezone(duty.timezone)
        period = period_containing(frequency, local.date())
        out.append((duty.id, period.key, period.start, period.end,
                    period.end - timedelta(days=duty.lead_days)))
    return out


def case_planner(engine: Engine, repeat: int, sample: int) -> list[Case]:
    duties = {f: [d for page in read_pages(engine, f, DEFAULT_PAGE_SIZE) for d in page] for f in FREQUENCIES}
    ranges = {f: periods_between(*open_range(f, AS_OF, 30)) for f in FREQUENCIES}
    total = sum(len(v) for v in duties.values())

    def ours() -> None:
        for f in FREQUENCIES:
            plan(duties[f], frequency=f, mode=Mode.SCHEDULED, as_of=AS_OF, requested=ranges[f])

    share = {f: duties[f][: max(1, sample * len(duties[f]) // total)] for f in FREQUENCIES}
    sampled = sum(len(v) for v in share.values())

    def naive() -> None:
        for f in FREQUENCIES:
            naive_plan(share[f], f)

    fast = median_time(ours, repeat)
    slow = median_time(naive, repeat) * total / sampled
    speedup = slow / fast
    return [Case("planner", fast, slow, speedup, ">= 20x", speedup >= 20,
                 note=f"{total:,} duties; the per-row planner timed on {sampled:,} and scaled")]


def _peak_rss_mb() -> float:
    """This process image's peak RSS. Not getrusage's ru_maxrss: Linux carries that over
    fork and exec, so a child spawned by a large parent would report the parent's size."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _dispatch_in_child(url: str, queue) -> None:
    engine = create_engine(driver_url(url))
    reset_dispatch(engine)
    scheduled_dispatch(engine)
    queue.put(_peak_rss_mb())


def case_memory(url: str) -> list[Case]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_dispatch_in_child, args=(url, queue))
    child.start()
    peak = queue.get(timeout=3600)
    child.join()
    return [Case("dispatch_memory", peak, 500, peak / 500, "<= 500MB", peak <= 500, unit="MB")]


def _enqueue(url: str, job_id: int, barrier, results) -> None:
    engine = create_engine(driver_url(url), pool_size=1)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    times = [AS_OF + timedelta(minutes=n) for n in range(10_000)]
    barrier.wait()
    started = time.perf_counter()
    created = len(enqueue_scheduled_many(engine, [(job_id, t) for t in times]))
    results.put((created, time.perf_counter() - started))


def _enqueue_round(url: str, processes: int) -> tuple[float, int]:
    engine = create_engine(driver_url(url))
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE job_queue, job RESTART IDENTITY CASCADE"))
    job_id = register_job(engine, "report", schedule="* * * * *")
    engine.dispose()
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    children = [context.Process(target=_enqueue, args=(url, job_id, barrier, results)) for _ in range(processes)]
    for child in children:
        child.start()
    barrier.wait()
    started = time.perf_counter()
    outcomes = [results.get(timeout=600) for _ in children]
    elapsed = time.perf_counter() - started
    for child in children:
        child.join()
    engine = create_engine(driver_url(url))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM job_queue")).scalar_one()
    engine.dispose()
    if sum(created for created, _ in outcomes) != rows:
        raise RuntimeError("created counts do not add up to the rows")
    return elapsed, rows


def case_enqueue_race(url: str, repeat: int) -> list[Case]:
    """Eight producers racing against one alone, their rounds taken in turn: a checkpoint
    or autovacuum left behind by an earlier case then weighs on both sides alike."""
    alone, raced, rows = [], [], set()
    for _ in range(repeat):
        alone.append(_enqueue_round(url, 1)[0])
        elapsed, count = _enqueue_round(url, 8)
        raced.append(elapsed)
        rows.add(count)
    alone, together = statistics.median(alone), statistics.median(raced)
    ratio = together / alone
    return [Case("enqueue_race", together, alone, ratio, "<= 1.5", ratio <= 1.5 and rows == {10_000},
                 note=f"rows {sorted(rows)}")]


# The other queues, each pinned and installed into a virtualenv of the benchmark's own
# (Oban for Python needs 3.12 or later).
BASELINES = ["pgqueuer==1.6.0", "oban==0.7.0", "procrastinate>=3,<4"]
BASELINE_QUEUES = ("procrastinate", "pgqueuer", "oban")
_PENDING = {
    "rota": "SELECT count(*) FROM job_queue WHERE state <> 'succeeded'",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
    "pgqueuer": "SELECT count(*) FROM pgqueuer",
    "oban": "SELECT count(*) FROM oban_jobs WHERE state <> 'completed'",
}
_EMPTY = {
    "rota": "TRUNCATE job_queue, job RESTART IDENTITY CASCADE",
    "procrastinate": "TRUNCATE procrastinate_jobs CASCADE",
    "pgqueuer": "TRUNCATE pgqueuer, pgqueuer_log",
    "oban": "TRUNCATE oban_jobs",
}
# The latency's floor (benchmarks.queue_floor) runs through rota's own table.
_PENDING["floor"], _EMPTY["floor"] = _PENDING["rota"], _EMPTY["rota"]
LATENCY_RATE = 100.0


def _baseline_python() -> str:
    """The Python of the baselines' virtualenv, made on first use (ROTA_BENCH_PYTHON names
    the interpreter to make it with, else the newest python3.1x found)."""
    venv = rota_home() / "bench-baselines"
    python = venv / "bin" / "python"
    if python.exists():
        return str(python)
    candidates = [os.environ.get("ROTA_BENCH_PYTHON")]
    candidates += [shutil.which(f"python3.{minor}") for minor in (14, 13, 12)]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python")), reverse=True)
    for candidate in filter(None, candidates):
        version = subprocess.run([candidate, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                                 capture_output=True, text=True)
        if version.stdout.strip() == "True":
            subprocess.run([candidate, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *BASELINES], check=True)
            return str(python)
    raise RuntimeError("the queue baselines need Python 3.12 or later (oban does): set ROTA_BENCH_PYTHON")


def _baseline(python: str, queue: str, *args: str, conninfo: str, env: dict | None = None,
              wait: bool = True) -> subprocess.Popen:
    command = {
        ("procrastinate", "work"): [str(Path(python).parent / "procrastinate"), "--app",
                                    "benchmarks.procrastinate_app.app", "worker", "--concurrency", str(CONCURRENCY)],
    }.get((queue, args[0]), [python, "-m", "benchmarks.queue_baselines", queue, *args])
    environment = {**os.environ, **(env or {}), "BENCH_CONNINFO": conninfo, "PYTHONPATH": str(PROJECT_ROOT)}
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL,
                               stderr=None if wait else subprocess.DEVNULL)
    if wait and process.wait(timeout=3600):
        raise RuntimeError(f"{queue} {' '.join(args)} failed")
    return process


def _pending(conninfo: str, queue: str) -> int:
    with psycopg.connect(conninfo) as conn:
        return conn.execute(_PENDING[queue]).fetchone()[0]


def _workers(queue: str, conninfo: str, python: str, url: str, env: dict | None = None) -> list[subprocess.Popen]:
    """Four workers of `queue`, idle until runs come, each executing up to CONCURRENCY runs at
    once; the floor's one listener (benchmarks.queue_floor)."""
    if queue == "floor":
        environment = {**os.environ, **(env or {}), "BENCH_CONNINFO": conninfo, "PYTHONPATH": str(PROJECT_ROOT)}
        return [subprocess.Popen([sys.executable, "-m", "benchmarks.queue_floor", "work"], env=environment,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    if queue != "rota":
        return [_baseline(python, queue, "work", conninfo=conninfo, env=env, wait=False) for _ in range(4)]
    rota = str(Path(sys.executable).parent / "rota")
    environment = {**os.environ, **(env or {}), "ROTA_DATABASE_URL": url, "PYTHONPATH": str(PROJECT_ROOT)}
    return [subprocess.Popen([rota, "worker", "--handlers", "benchmarks.rota_latency", "--concurrency",
                              str(CONCURRENCY)], env=environment,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]


def _until_done(queue: str, conninfo: str, workers: list[subprocess.Popen]) -> None:
    while _pending(conninfo, queue):
        if any(worker.poll() is not None for worker in workers):
            raise RuntimeError(f"a {queue} worker exited with work left")
        time.sleep(0.05)


def _stop(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()


def _empty(conninfo: str, queue: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(_EMPTY[queue])


def _drain(queue: str, url: str, python: str, runs: int) -> float:
    """Seconds four workers take to run `runs` no-op runs, queued before they start."""
    conninfo = libpq_url(url)
    _empty(conninfo, queue)
    if queue == "rota":
        engine = create_engine(driver_url(url))
        job_id = register_job(engine, "bench_noop")
        due = datetime.now(timezone.utc) - timedelta(days=1)
        enqueue_scheduled_many(engine, [(job_id, due - timedelta(minutes=n)) for n in range(runs)])
        engine.dispose()
    else:
        _baseline(python, queue, "enqueue", str(runs), conninfo=conninfo)
    started = time.perf_counter()
    workers = _workers(queue, conninfo, python, url)
    try:
        _until_done(queue, conninfo, workers)
        return time.perf_counter() - started
    finally:
        _stop(workers)


def _latency(queue: str, url: str, python: str, runs: int) -> tuple[float, float]:
    """p50 and p99 of the seconds from a run falling due to its handler starting, with
    runs queued one at a time at LATENCY_RATE a second to four idle workers."""
    conninfo = libpq_url(url)
    _empty(conninfo, queue)
    with tempfile.TemporaryDirectory() as measured:
        workers = _workers(queue, conninfo, python, url, env={"BENCH_LATENCY_DIR": measured})
        try:
            time.sleep(5)  # connected and idle
            if queue == "rota":
                engine = create_engine(driver_url(url))
                job_id = register_job(engine, "bench_noop")
                started = time.monotonic()
                for n in range(runs):
                    time.sleep(max(0.0, started + n / LATENCY_RATE - time.monotonic()))
                    enqueue_scheduled(engine, job_id, datetime.now(timezone.utc))
                engine.dispose()
            elif queue == "floor":
                engine = create_engine(driver_url(url))
                job_id = register_job(engine, "bench_noop")
                engine.dispose()
                produce(conninfo, job_id, runs, LATENCY_RATE)
            else:
                _baseline(python, queue, "produce", str(runs), str(LATENCY_RATE), conninfo=conninfo)
            _until_done(queue, conninfo, workers)
        finally:
            _stop(workers)
        latencies = sorted(float(line) for f in Path(measured).iterdir() for line in f.read_text().split())
    if len(latencies) != runs:
        raise RuntimeError(f"{queue}: {len(latencies)} of {runs} runs measured")
    return latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


def case_queue_throughput(server_url: str, runs: int, repeat: int) -> list[Case]:
    python = _baseline_python()
    url = fresh_database(server_url, "rota_bench_queue")
    conninfo = libpq_url(url)
    for queue in BASELINE_QUEUES:
        _baseline(python, queue, "install", conninfo=conninfo)
    drained = {queue: statistics.median(_drain(queue, url, python, runs) for _ in range(repeat))
               for queue in ("rota", *BASELINE_QUEUES)}
    fastest = min(BASELINE_QUEUES, key=drained.get)
    others = ", ".join(f"{queue} {drained[queue]:.1f} s" for queue in BASELINE_QUEUES)
    cases = [Case("queue_throughput", drained["rota"], drained[fastest], drained["rota"] / drained[fastest],
                  "<= 0.5", drained["rota"] <= 0.5 * drained[fastest],
                  note=f"{runs:,} no-op runs, four workers each; baseline {fastest} (of {others})")]
    light = int(LATENCY_RATE * 20)
    # In turns, as the dispatch's sides: the machine's speed drifts over minutes.
    rounds = [{queue: _latency(queue, url, python, light) for queue in ("rota", "floor", *BASELINE_QUEUES)}
              for _ in range(repeat)]
    latency = {queue: tuple(statistics.median(measured[queue][index] for measured in rounds) for index in (0, 1))
               for queue in rounds[0]}
    for index, name, goal in ((0, "p50", 0.5), (1, "p99", 0.7)):
        best = min(BASELINE_QUEUES, key=lambda queue: latency[queue][index])
        ours, theirs = latency["rota"][index] * 1000, latency[best][index] * 1000
        others = ", ".join(f"{queue} {latency[queue][index] * 1000:.1f}" for queue in BASELINE_QUEUES)
        cases.append(Case(f"queue_latency_{name}", ours, theirs, ours / theirs, f"<= {goal}", ours <= goal * theirs, unit="ms",
                          note=f"run_at to start, {light:,} runs at {LATENCY_RATE:.0f}/s; baseline {best} "
                               f"(of {others} ms)"))
    # The least the contract allows, so that a goal the floor itself misses shows as such.
    for index, name in ((0, "p50"), (1, "p99")):
        best = min(BASELINE_QUEUES, key=lambda queue: latency[queue][index])
        ours, floor = latency["rota"][index] * 1000, latency["floor"][index] * 1000
        cases.append(Case(f"queue_{name}_vs_floor", ours, floor, ours / floor, "<= 1.2", ours <= 1.2 * floor,
                          unit="ms", note=f"against SPEC's bare path (benchmarks.queue_floor), itself "
                                          f"{floor / (latency[best][index] * 1000):.2f} of {best}'s"))
    return cases


def _scheduled_runs_through_dagster() -> Callable[[str], None]:
    """What runs a frequency's scheduled run as of AS_OF through Dagster, in process: the
    schedule's own job (the dispatch and its completeness check; the freshness check is the
    half-past job's) with the run request a tick at AS_OF makes, on an ephemeral instance
    (no run launcher, executor process or run storage of a deployment's). The definitions
    load here, before anything is timed, with partitions from a year before AS_OF: a
    benchmark database's history starts the day it is made, which after AS_OF has no
    partition for it."""
    os.environ.setdefault(HISTORY_OVERRIDE, (AS_OF - timedelta(days=366)).date().isoformat())
    from dagster import DagsterInstance

    from rota.pipelines.definitions import defs
    from rota.schedules.dispatch import DISPATCH_JOBS, scheduled_run_request

    def scheduled_run(frequency: str) -> None:
        request = scheduled_run_request(frequency, AS_OF)
        defs.resolve_job_def(DISPATCH_JOBS[frequency].name).execute_in_process(
            run_config=request.run_config, tags=request.tags, instance=DagsterInstance.ephemeral())

    return scheduled_run


def case_dagster_overhead(engine: Engine, repeat: int) -> list[Case]:
    scheduled_run = _scheduled_runs_through_dagster()

    def through_dagster() -> None:
        for frequency in FREQUENCIES:
            scheduled_run(frequency)

    # In turns, as case_dispatch's rounds, so the machine's drift falls on both sides.
    turns = [(timed(lambda: scheduled_dispatch(engine), lambda: reset_dispatch(engine)),
              timed(through_dagster, lambda: reset_dispatch(engine))) for _ in range(repeat)]
    direct, dagster = (statistics.median(side) for side in zip(*turns))
    ratio = dagster / direct
    return [Case("dagster_overhead", dagster, direct, ratio, "<= 1.2", ratio <= 1.2)]


TENANT_HOLD_SECONDS = 60


@contextmanager
def _rota_database(url: str) -> Iterator[None]:
    """ROTA_DATABASE_URL set to `url` for the block, then as it was: the definitions'
    database resource reads it (an EnvVar) at each run, and the cases after this one run
    on main's database."""
    outer = os.environ.get("ROTA_DATABASE_URL")
    os.environ["ROTA_DATABASE_URL"] = url
    try:
        yield
    finally:
        if outer is None:
            os.environ.pop("ROTA_DATABASE_URL", None)
        else:
            os.environ["ROTA_DATABASE_URL"] = outer


def _run_held_by_a_tenant(run: Callable[[], None], url: str, engine: Engine, locked: int,
                          statement: str) -> tuple[float, int, bool]:
    """`run`'s time while a tenant holds `statement` on duty `locked` (it lets go
    after TENANT_HOLD_SECONDS whatever happens), the duties with a task by the run's end,
    and whether the tenant still held on then."""
    with psycopg.connect(libpq_url(url), autocommit=False) as tenant:
        tenant.execute("SET ROLE rota_app")
        tenant.execute("SELECT set_config('rota.workspace_id', %s, true)", (workspace_of(locked, 50),))
        tenant.execute(statement, (locked,))
        letting_go = threading.Timer(TENANT_HOLD_SECONDS, tenant.rollback)
        letting_go.start()
        started = time.perf_counter()
        run()
        elapsed = time.perf_counter() - started
        with engine.connect() as conn:
            with_task = conn.execute(text("SELECT count(DISTINCT duty_id) FROM task")).scalar_one()
        holding = letting_go.is_alive()
        letting_go.cancel()
        tenant.rollback()
    return elapsed, with_task, holding


def _duty_complete(engine: Engine, duty_id: int) -> bool:
    """Whether the duty has its task and its marks moved."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT d.last_dispatched_period IS NOT NULL AND EXISTS (SELECT 1 FROM task t WHERE t.duty_id = d.id) "
            "FROM duty d WHERE d.id = :id"), {"id": duty_id}).scalar_one()


def case_tenant_lock(server_url: str, duties: int, repeat: int) -> list[Case]:
    """A daily scheduled run through Dagster over `duties` duties of 50 workspaces, while one
    tenant (role rota_app, its workspace set in its transaction as README's "Add a duty"
    shows) holds an uncommitted UPDATE of one duty's title (or a SELECT … FOR UPDATE of it) for up to
    TENANT_HOLD_SECONDS, against the same run with no tenant at all. Then the first run after
    the tenant lets go must leave the duty complete, its marks moved."""
    scheduled_run = _scheduled_runs_through_dagster()
    url = fresh_database(server_url, "rota_bench_tenants")
    engine = create_engine(driver_url(url))
    load_duties(engine, duties, frequencies=[("daily", 1)], workspaces=50)
    locked = duties // 2

    def daily_run() -> None:
        scheduled_run("daily")

    kinds = (("tenant_update_held", "UPDATE duty SET title = 'renamed, not committed' WHERE id = %s", duties),
             ("tenant_for_update", "SELECT 1 FROM duty WHERE id = %s FOR UPDATE", duties - 1))
    free: list[float] = []
    held: dict[str, list[tuple[float, int, bool]]] = {name: [] for name, _, _ in kinds}
    done = dict.fromkeys(held, True)
    try:
        with _rota_database(url):
            # In rounds, as case_dispatch's: a side timed in a block of its own minutes after
            # the other would carry the machine's drift into the ratio (docs/perf.md).
            for at in range(repeat):
                free.append(timed(daily_run, lambda: reset_dispatch(engine)))
                # Each lock goes first in turn, so neither always runs furthest from the free run.
                for name, statement, _ in kinds[::1 if at % 2 else -1]:
                    reset_dispatch(engine)
                    held[name].append(_run_held_by_a_tenant(daily_run, url, engine, locked, statement))
                    daily_run()  # the first run after the tenant let go
                    done[name] = done[name] and _duty_complete(engine, locked)
    finally:
        engine.dispose()
    cases, baseline = [], statistics.median(free)
    for name, _, expected in kinds:
        runs = held[name]
        elapsed = statistics.median(t for t, _, _ in runs)
        complete = all(n == expected and holding for _, n, holding in runs)
        ratio = elapsed / baseline
        cases.append(Case(name, elapsed, baseline, ratio, "<= 1.2", ratio <= 1.2 and complete and done[name],
                          note=f"{duties:,} duties of 50 workspaces through Dagster; during the hold "
                               f"{min(n for _, n, _ in runs):,} of {duties:,} duties had their task "
                               f"(expected {expected:,}); after each, duty {locked} "
                               + ("complete, marks moved" if done[name] else "STILL INCOMPLETE")))
    return cases


def main(duties: int = 1_000_000, backfill_duties: int = 100_000, queue_runs: int = 100_000,
         repeat: int = 3, planner_sample: int = 100_000, only: list[str] | None = None,
         history_days: int = 365, year_duties: int = 100_000, tenant_duties: int = 100_000) -> int:
    server = resolve_database_url()
    print(f"benchmarks: {duties:,} duties, {backfill_duties:,} for the backfill, {queue_runs:,} queue runs, "
          f"median of {repeat}; nproc {os.cpu_count()}", flush=True)
    url = fresh_database(server, "rota_bench")
    os.environ["ROTA_DATABASE_URL"] = url
    engine = create_engine(driver_url(url))
    cases: list[Case] = []
    # The steps marked True read rota_bench's million duties; the others build databases of
    # their own or, as `enqueue`, use its queue tables alone, so `--only` of those alone
    # never loads them (minutes).
    steps = [
        ("dispatch", True, lambda: case_dispatch(engine, repeat)),
        ("foreign_key", True, lambda: case_task_duty_check(engine, repeat)),
        ("year", False, lambda: case_dispatch_after_a_year(server, year_duties, history_days, repeat)),
        ("backfill", False, lambda: case_backfill(server, backfill_duties, repeat)),
        ("planner", True, lambda: case_planner(engine, repeat, planner_sample)),
        ("memory", True, lambda: case_memory(url)),
        ("enqueue", False, lambda: case_enqueue_race(url, repeat)),
        ("queue", False, lambda: case_queue_throughput(server, queue_runs, repeat)),
        ("dagster", True, lambda: case_dagster_overhead(engine, repeat)),
        ("tenants", False, lambda: case_tenant_lock(server, tenant_duties, repeat)),
    ]
    loaded = False
    for name, reads_duties, step in steps:
        if only and name not in only:
            continue
        if reads_duties and not loaded:
            load_duties(engine, duties)
            loaded = True
        for case in step():
            print(case.line(), flush=True)
            cases.append(case)
    passed = sum(case.passed for case in cases)
    print(f"{passed} of {len(cases)} cases pass", flush=True)
    return 0 if passed == len(cases) else 1
