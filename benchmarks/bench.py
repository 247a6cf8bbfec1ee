"""`rota bench`: every benchmark case, each a ratio against a baseline measured in the
same run, median of at least three repetitions. Builds its own data in databases of
its own on the embedded PostgreSQL (or ROTA_DATABASE_URL's server)."""

import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import psycopg
from psycopg import sql
from sqlalchemy import Engine, create_engine, text

from benchmarks.data import load_duties, reset_dispatch
from pipelines import migrations
from pipelines.dispatch import DEFAULT_PAGE_SIZE, dispatch, read_pages
from pipelines.periods import open_range, period_containing, periods_between
from pipelines.planner import Mode, plan
from pipelines.queue import enqueue_scheduled_many, register_job
from pipelines.schema import FREQUENCIES
from resources.server import PROJECT_ROOT, driver_url, libpq_url, resolve_database_url, with_database

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


def median_time(work: Callable[[], object], repeat: int, before: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if before:
            before()
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


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
            for row in plan(page, frequency=frequency, mode=mode, as_of=AS_OF, requested=requested).tasks:
                rows.append((row.duty_id, row.period_key, workspace_of[row.duty_id], *row[2:]))
    return rows


def copy_baseline(engine: Engine, rows: list[tuple]) -> Callable[[], None]:
    def prepare() -> None:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS task_copy"))
            conn.execute(text("CREATE TABLE task_copy (LIKE task INCLUDING ALL)"))

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


def fingerprint(engine: Engine) -> dict:
    from tests.helpers import database_fingerprint

    result = database_fingerprint(engine)
    result.pop("task_copy", None)
    return result


def case_dispatch(engine: Engine, repeat: int) -> list[Case]:
    ranges = {f: (Mode.SCHEDULED, periods_between(*open_range(f, AS_OF, 30))) for f in FREQUENCIES}
    reset_dispatch(engine)
    rows = planned_rows(engine, ranges)
    prepare, work = copy_baseline(engine, rows)
    copy_time = median_time(work, repeat, prepare)
    prepare_floor, floor_work = floor_baseline(engine, rows)
    floor_time = median_time(floor_work, repeat, prepare_floor)
    first = median_time(lambda: scheduled_dispatch(engine), repeat, lambda: reset_dispatch(engine))
    before = fingerprint(engine)
    noop = median_time(lambda: scheduled_dispatch(engine), repeat)
    unchanged = fingerprint(engine) == before
    return [
        Case("dispatch_first", first, copy_time, first / copy_time, "<= 2.5", first / copy_time <= 2.5,
             note=f"{len(rows):,} tasks"),
        Case("dispatch_vs_floor", first, floor_time, first / floor_time, "<= 1.5", first / floor_time <= 1.5,
             note="baseline: the COPY plus one UPDATE of last_dispatched_period"),
        Case("dispatch_noop", noop, copy_time, noop / copy_time, "<= 0.5", noop / copy_time <= 0.5 and unchanged,
             note="zero writes" if unchanged else "WROTE SOMETHING"),
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
    alone = statistics.median(_enqueue_round(url, 1)[0] for _ in range(repeat))
    raced, rows = [], set()
    for _ in range(repeat):
        elapsed, count = _enqueue_round(url, 8)
        raced.append(elapsed)
        rows.add(count)
    together = statistics.median(raced)
    ratio = together / alone
    return [Case("enqueue_race", together, alone, ratio, "<= 2", ratio <= 2 and rows == {10_000},
                 note=f"rows {sorted(rows)}")]


def _drain_rota(url: str, runs: int) -> float:
    engine = create_engine(driver_url(url))
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE job_queue, job RESTART IDENTITY CASCADE"))
    job_id = register_job(engine, "noop")
    due = datetime.now(timezone.utc) - timedelta(days=1)
    enqueue_scheduled_many(engine, [(job_id, due - timedelta(minutes=n)) for n in range(runs)])
    env = {**os.environ, "ROTA_DATABASE_URL": url}
    rota = str(Path(sys.executable).parent / "rota")
    started = time.perf_counter()
    workers = [subprocess.Popen([rota, "worker", "--poll", "0.05"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]
    try:
        while True:
            with engine.connect() as conn:
                if not conn.execute(text("SELECT EXISTS (SELECT 1 FROM job_queue WHERE state <> 'succeeded')")).scalar():
                    break
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=60)
    engine.dispose()
    return elapsed


def _ensure_procrastinate() -> None:
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "procrastinate>=3,<4"], check=True)


def _drain_procrastinate(conninfo: str, runs: int) -> float:
    env = {**os.environ, "BENCH_CONNINFO": conninfo, "PYTHONPATH": str(PROJECT_ROOT)}
    script = (
        "from benchmarks.procrastinate_app import app, noop\n"
        "with app.open():\n"
        f"    noop.batch_defer(*[{{}}] * {runs})\n"
    )
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_jobs CASCADE")
    subprocess.run([sys.executable, "-c", script], env=env, check=True)
    procrastinate = str(Path(sys.executable).parent / "procrastinate")
    started = time.perf_counter()
    workers = [subprocess.Popen([procrastinate, "--app", "benchmarks.procrastinate_app.app", "worker",
                                 "--concurrency", "1", "--one-shot"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]
    for worker in workers:
        worker.wait(timeout=3600)
    elapsed = time.perf_counter() - started
    with psycopg.connect(conninfo) as conn:
        left = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'").fetchone()[0]
    if left:
        raise RuntimeError(f"procrastinate left {left} jobs undone")
    return elapsed


def case_queue_throughput(server_url: str, runs: int, repeat: int) -> list[Case]:
    _ensure_procrastinate()
    url = fresh_database(server_url, "rota_bench_queue")
    conninfo = libpq_url(url)
    env = {**os.environ, "BENCH_CONNINFO": conninfo, "PYTHONPATH": str(PROJECT_ROOT)}
    subprocess.run([sys.executable, "-c", "from benchmarks.procrastinate_app import app\n"
                    "with app.open():\n    app.schema_manager.apply_schema()"], env=env, check=True)
    ours = statistics.median(_drain_rota(url, runs) for _ in range(repeat))
    theirs = statistics.median(_drain_procrastinate(conninfo, runs) for _ in range(repeat))
    return [Case("queue_throughput", ours, theirs, ours / theirs, "<= 1", ours <= theirs,
                 note=f"{runs:,} no-op runs, four workers each; baseline procrastinate")]


def case_dagster_overhead(engine: Engine, repeat: int) -> list[Case]:
    from dagster import DagsterInstance, materialize
    from dagster._core.storage.tags import (
        ASSET_PARTITION_RANGE_END_TAG,
        ASSET_PARTITION_RANGE_START_TAG,
        SCHEDULE_NAME_TAG,
    )

    from pipelines.definitions import defs

    def through_dagster() -> None:
        for frequency in FREQUENCIES:
            first, last = open_range(frequency, AS_OF, 30)
            name = f"{frequency}_tasks"
            result = materialize(
                [defs.resolve_assets_def(name)], instance=DagsterInstance.ephemeral(),
                tags={ASSET_PARTITION_RANGE_START_TAG: first.partition_key,
                      ASSET_PARTITION_RANGE_END_TAG: last.partition_key, SCHEDULE_NAME_TAG: f"{name}_schedule"},
                run_config={"ops": {name: {"config": {"as_of": AS_OF.isoformat()}}}},
            )
            if not result.success:
                raise RuntimeError(f"{name} failed")

    direct = median_time(lambda: scheduled_dispatch(engine), repeat, lambda: reset_dispatch(engine))
    dagster = median_time(through_dagster, repeat, lambda: reset_dispatch(engine))
    ratio = dagster / direct
    return [Case("dagster_overhead", dagster, direct, ratio, "<= 1.2", ratio <= 1.2)]


def main(duties: int = 1_000_000, backfill_duties: int = 100_000, queue_runs: int = 100_000,
         repeat: int = 3, planner_sample: int = 100_000, only: list[str] | None = None) -> int:
    sys.path.insert(0, str(PROJECT_ROOT))
    server = resolve_database_url()
    print(f"rota bench: {duties:,} duties, {backfill_duties:,} for the backfill, {queue_runs:,} queue runs, "
          f"median of {repeat}; nproc {os.cpu_count()}", flush=True)
    url = fresh_database(server, "rota_bench")
    os.environ["ROTA_DATABASE_URL"] = url
    engine = create_engine(driver_url(url))
    load_duties(engine, duties)
    cases: list[Case] = []
    steps = [
        ("dispatch", lambda: case_dispatch(engine, repeat)),
        ("backfill", lambda: case_backfill(server, backfill_duties, repeat)),
        ("planner", lambda: case_planner(engine, repeat, planner_sample)),
        ("memory", lambda: case_memory(url)),
        ("enqueue", lambda: case_enqueue_race(url, repeat)),
        ("queue", lambda: case_queue_throughput(server, queue_runs, repeat)),
        ("dagster", lambda: case_dagster_overhead(engine, repeat)),
    ]
    for name, step in steps:
        if only and name not in only:
            continue
        for case in step():
            print(case.line(), flush=True)
            cases.append(case)
    passed = sum(case.passed for case in cases)
    print(f"{passed} of {len(cases)} cases pass", flush=True)
    return 0 if passed == len(cases) else 1
