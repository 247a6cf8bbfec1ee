"""Crashes in the middle of a dispatch (issue 6, cases 1 and 3): the process killed with
SIGKILL, its connection terminated by the server. Whatever was committed is whole, and
the next run completes the work exactly as the planner expects."""

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text

from benchmarks.data import load_duties
from pipelines.dispatch import DatabaseWentAway, dispatch, read_pages
from pipelines.periods import open_range, parse_instant, periods_between
from pipelines.planner import Mode, plan
from resources.server import driver_url, libpq_url

AS_OF = "2026-12-02T12:00:00Z"
PROJECT = Path(__file__).resolve().parent.parent
CHILD = """
import sys
from sqlalchemy import create_engine
from pipelines.dispatch import dispatch
from pipelines.periods import open_range, parse_instant, periods_between
from pipelines.planner import Mode
from resources.server import driver_url
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
    assert not report.unplannable and not report.missing
    return report


def _expected(engine) -> set[tuple[int, str]]:
    """What the pure planner says the tasks are, computed before anything is written."""
    expected = set()
    for page in read_pages(engine, "monthly", 20_000):
        result = plan(page, frequency="monthly", mode=Mode.SCHEDULED, as_of=parse_instant(AS_OF),
                      requested=_requested())
        expected |= {(t.duty_id, t.period_key) for t in result.tasks}
    return expected


def _tasks(engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT duty_id, period_key FROM task"))]


def _marks_ahead_of_tasks(engine) -> int:
    """Duties whose last_dispatched_period is not the newest of their tasks."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM duty d WHERE d.last_dispatched_period IS DISTINCT FROM "
            "(SELECT max(t.period_key) FROM task t WHERE t.duty_id = d.id)")).scalar_one()


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
                pids = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'rota-victim' "
                                     "AND query LIKE '%%INSERT INTO task%%' AND state = 'active'").fetchall()
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
