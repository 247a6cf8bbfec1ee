"""Crashes in the middle of a dispatch (issue 6, cases 1 and 3): the process killed with
SIGKILL, its connection terminated by the server. Whatever was committed is whole, and
the next run completes the work exactly as the planner expects."""

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text

from benchmarks.data import load_duties
from rota.pipelines.dispatch.planner import Mode, plan
from rota.pipelines.dispatch.reading import read_pages
from rota.pipelines.dispatch.run import DatabaseWentAway, dispatch
from rota.pipelines.periods.calendar import open_range, parse_instant, periods_between
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import produce
from rota.pipelines.queue.worker import Worker
from rota.pipelines.queue.worker_settings import WorkerSettings
from rota.resources.database import migrate as migrations
from rota.resources.database.server import (
    driver_url,
    libpq_url,
    start_embedded,
    stop_embedded,
    with_database,
)
from tests.helpers import gaps_after, planned_tasks
from tests.paths import CHECKOUT_STATE

AS_OF = "2026-12-02T12:00:00Z"
PROJECT = Path(__file__).resolve().parents[2]
CHILD = """
import sys
from sqlalchemy import create_engine
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.periods.calendar import open_range, parse_instant, periods_between
from rota.pipelines.dispatch.planner import Mode
from rota.resources.database.server import driver_url
as_of = parse_instant(sys.argv[2])
engine = create_engine(driver_url(sys.argv[1]))
print("started", flush=True)
dispatch(engine, frequency="monthly", mode=Mode.SCHEDULED, as_of=as_of,
         requested=periods_between(*open_range("monthly", as_of, 30)), page_size=5000)
print("finished", flush=True)
"""


def _requested():
    return periods_between(*open_range("monthly", parse_instant(AS_OF), 30))


def _run(engine, page_size=5000):
    report = dispatch(engine, frequency="monthly", mode=Mode.SCHEDULED, as_of=parse_instant(AS_OF),
                      requested=_requested(), page_size=page_size)
    assert not report.unplannable and not gaps_after(engine, report).count
    return report


def _expected(engine) -> set[tuple[int, str]]:
    """What the pure planner says the tasks are, computed before anything is written."""
    expected = set()
    for page in read_pages(engine, "monthly", 20_000):
        result = plan(page, frequency="monthly", mode=Mode.SCHEDULED, as_of=parse_instant(AS_OF),
                      requested=_requested())
        expected |= {(t.duty_id, t.period_key) for t in planned_tasks(result)}
    return expected


def _tasks(engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT duty_id, period_key FROM task"))]


def _marks_ahead_of_tasks(engine) -> int:
    """Duties whose last_dispatched_period is not the newest of their tasks."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM duty d "
            "LEFT JOIN (SELECT duty_id, max(period_key) AS newest FROM task GROUP BY duty_id) t ON t.duty_id = d.id "
            "WHERE d.last_dispatched_period IS DISTINCT FROM t.newest")).scalar_one()


def _reset(engine):
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE task RESTART IDENTITY"))
        conn.execute(text("UPDATE duty SET last_dispatched_period = NULL WHERE last_dispatched_period IS NOT NULL"))


@pytest.mark.slow
def test_a_dispatch_killed_at_ten_random_moments_is_healed_by_the_next_run(database_url, engine):
    load_duties(engine, 200_000, frequencies=[("monthly", 1)])
    expected = _expected(engine)
    assert len(expected) >= 200_000
    started = time.perf_counter()
    _run(engine)
    full = time.perf_counter() - started
    rng = random.Random(20261202)
    moments = sorted(rng.uniform(0.05, 1.0) * full for _ in range(10))
    outcomes = []
    for moment in moments:
        _reset(engine)
        child = subprocess.Popen([sys.executable, "-c", CHILD, database_url, AS_OF], cwd=PROJECT,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(PROJECT)})
        assert child.stdout.readline().strip() == "started"
        time.sleep(moment)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        partial = _tasks(engine)
        # What was committed before the kill is whole: no duplicate, nothing unplanned,
        # and no duty marked ahead of the tasks it has.
        assert len(partial) == len(set(partial)) and set(partial) <= expected
        assert _marks_ahead_of_tasks(engine) == 0
        _run(engine)
        healed = _tasks(engine)
        assert len(healed) == len(set(healed)) and set(healed) == expected, moment
        assert _marks_ahead_of_tasks(engine) == 0
        outcomes.append(len(partial))
    # The moments really fell inside the run: some before any page, some in the middle.
    assert min(outcomes) < len(expected) and max(outcomes) > 0, outcomes


def test_a_terminated_connection_fails_the_run_loudly_and_the_next_run_heals(database_url, engine):
    load_duties(engine, 30_000, frequencies=[("monthly", 1)])
    expected = _expected(engine)
    victim = create_engine(driver_url(database_url), connect_args={"application_name": "rota-victim"})
    terminated = threading.Event()

    def terminator():
        with psycopg.connect(libpq_url(database_url), autocommit=True) as admin:
            while not terminated.is_set():
                # A page writes its tasks by COPY (the bulk path) or by INSERT (any other).
                pids = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'rota-victim' "
                                     "AND (query LIKE 'COPY task %%' OR query LIKE '%%INSERT INTO task%%') "
                                     "AND state = 'active'").fetchall()
                for (pid,) in pids:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    terminated.set()
                time.sleep(0.005)

    killer = threading.Thread(target=terminator, daemon=True)
    killer.start()
    with pytest.raises(DatabaseWentAway, match=r"monthly dispatch lost the database during page \d+ .*connection"):
        _run(victim, page_size=2000)
    killer.join(timeout=10)
    victim.dispose()
    assert terminated.is_set()
    partial = _tasks(engine)
    assert 0 <= len(partial) < len(expected) and set(partial) <= expected
    assert _marks_ahead_of_tasks(engine) == 0
    _run(engine, page_size=2000)
    assert sorted(_tasks(engine)) == sorted(expected)
    assert _marks_ahead_of_tasks(engine) == 0


@pytest.fixture
def private_server():
    """A server of this test's own, so it can be crashed without taking the suite's down.
    A server named by ROTA_DATABASE_URL is shared and cannot be crashed by a test."""
    if os.environ.get("ROTA_DATABASE_URL"):
        pytest.skip("crashes a PostgreSQL of its own (the embedded one); ROTA_DATABASE_URL names a shared server")
    datadir = CHECKOUT_STATE / "test" / f"crash-{os.getpid()}"
    shutil.rmtree(datadir, ignore_errors=True)
    datadir.parent.mkdir(parents=True, exist_ok=True)
    start_embedded(datadir, database="postgres")
    yield datadir
    stop_embedded(datadir)
    shutil.rmtree(datadir, ignore_errors=True)


def _crash_and_restart(datadir):
    stop_embedded(datadir, mode="immediate")
    time.sleep(0.5)
    start_embedded(datadir, database="postgres")


@pytest.mark.slow
def test_postgres_crashing_mid_dispatch_and_mid_worker_run_fails_loudly_and_heals(private_server, caplog):
    server = start_embedded(private_server, database="postgres")
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute("CREATE DATABASE rota")
    url = with_database(server, "rota")
    migrations.upgrade(url)
    engine = create_engine(driver_url(url), pool_pre_ping=True)
    load_duties(engine, 60_000, frequencies=[("monthly", 1)])
    expected = _expected(engine)

    outcome = {}

    def dispatching():
        try:
            _run(engine, page_size=1000)
            outcome["result"] = "finished"
        except Exception as error:  # noqa: BLE001 - the error is what is tested
            outcome["result"] = error

    writer = threading.Thread(target=dispatching)
    writer.start()
    deadline = time.monotonic() + 60
    while not _tasks_or_none(engine) and time.monotonic() < deadline:
        time.sleep(0.02)
    _crash_and_restart(private_server)
    writer.join(timeout=60)
    error = outcome["result"]
    assert isinstance(error, DatabaseWentAway), error
    assert "lost the database" in str(error)
    partial = _tasks(engine)
    assert 0 < len(partial) < len(expected) and set(partial) <= expected
    assert _marks_ahead_of_tasks(engine) == 0
    _run(engine, page_size=1000)
    assert sorted(_tasks(engine)) == sorted(expected)
    assert _marks_ahead_of_tasks(engine) == 0

    # A worker with a run in progress when the database crashes: it says so, waits the
    # outage out, and the run is reclaimed and completed once the database is back.
    import tests.worker_handlers  # noqa: F401 - registers the "sleep" handler

    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))
    job_id = register_job(engine, "sleep")
    produce(engine, "test", "outage", "sleep", {"seconds": 1.5})
    worker = Worker(engine, WorkerSettings(lease=timedelta(seconds=2), poll_interval=0.05,
                                           reclaim_interval=0.2, backoff=timedelta(0)))
    runner = threading.Thread(target=worker.run)
    caplog.set_level(logging.INFO, logger="rota.pipelines.queue.worker")
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while not _handler_calls(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Down until the worker has failed to record the finished run: a restart that beats
        # the handler's sleep would let the run complete on its first attempt.
        stop_embedded(private_server, mode="immediate")
        deadline = time.monotonic() + 30
        while "finished, but the database went away" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        start_embedded(private_server, database="postgres")
        deadline = time.monotonic() + 60
        while _run_state(engine, job_id) != "succeeded" and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        worker.stopping.set()
        runner.join(timeout=30)
    assert _run_state(engine, job_id) == "succeeded"
    assert "the database went away" in caplog.text
    assert [attempt for (attempt,) in _handler_calls(engine)] == [1, 2]
    engine.dispose()


def _tasks_or_none(engine):
    try:
        return _tasks(engine)
    except Exception:  # noqa: BLE001 - polling while the writer works
        return None


def _handler_calls(engine):
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT attempt FROM handler_call ORDER BY at")).all()
    except Exception:  # noqa: BLE001 - the database may be restarting
        return []


def _run_state(engine, job_id):
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT state FROM job_queue WHERE job_id = :j"), {"j": job_id}).scalar_one()
    except Exception:  # noqa: BLE001 - the database may be restarting
        return None
