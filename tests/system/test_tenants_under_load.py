"""Fifty tenant sessions at work while a one-million-duty dispatch runs (issue 6, case 5):
no tenant error, no task's updated_at moved by the dispatcher, and the tenants' p99
latency reported against an idle baseline (reported, not asserted: speed is measured in
benchmarks, never in tests)."""

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from benchmarks.data import load_duties
from rota.pipelines.dispatch.writing import ensure_partitions
from tests.helpers import tenant

PROJECT = Path(__file__).resolve().parents[2]
TENANTS = 50
DISPATCH = """
import sys
from sqlalchemy import create_engine
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.periods.calendar import open_range, parse_instant, periods_between
from rota.pipelines.dispatch.planner import Mode
from rota.resources.database.server import driver_url
from tests.helpers import gaps_after
as_of = parse_instant("2026-12-02T12:00:00Z")
engine = create_engine(driver_url(sys.argv[1]))
report = dispatch(engine, frequency="monthly", mode=Mode.SCHEDULED, as_of=as_of,
                  requested=periods_between(*open_range("monthly", as_of, 30)))
assert not report.unplannable and not gaps_after(engine, report).count
print(report.total("created"), flush=True)
"""


def _workspace(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"  # as benchmarks.data.load_duties spreads duties


class TenantSession(threading.Thread):
    """A person at work: completes or skips last month's task of one duty after another
    of its workspace (looked up by its identity, as an app opening a duty would), with a
    pause between actions, timing each."""

    def __init__(self, database_url: str, n: int):
        super().__init__(daemon=True)
        self.conn = tenant(database_url, _workspace(n))
        self.phase = "idle"
        self.latencies: dict[str, list[float]] = {"idle": [], "dispatch": []}
        self.acted: dict[int, object] = {}
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.n = n

    def run(self) -> None:
        # load_duties puts duty n in workspace (n % 97) + 1.
        for duty_id in range(self.n - 1 or 97, 1_000_001, 97):
            if self.stopping.is_set():
                return
            started = time.perf_counter()
            try:
                row = self.conn.execute(
                    "UPDATE task SET status = %s, updated_at = clock_timestamp() "
                    "WHERE duty_id = %s AND period_key = '2026-10' RETURNING id, updated_at",
                    ("done" if duty_id % 3 else "skipped", duty_id)).fetchone()
            except Exception as error:  # noqa: BLE001 - every tenant error is a finding
                self.errors.append(f"tenant {self.n}: {type(error).__name__}: {error}")
                continue
            self.latencies[self.phase].append(time.perf_counter() - started)
            if row is None:
                self.errors.append(f"tenant {self.n}: duty {duty_id} has no task of 2026-10")
                return
            self.acted[row[0]] = row[1]
            time.sleep(0.1)
        self.errors.append(f"tenant {self.n}: ran out of tasks")


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] * 1000


@pytest.mark.slow
def test_fifty_tenants_work_undisturbed_while_a_million_duties_are_dispatched(database_url, engine, capsys):
    load_duties(engine, 1_000_000, frequencies=[("monthly", 1)])
    ensure_partitions(engine, ["2026-10"])
    with engine.begin() as conn:  # last month's tasks, which the tenants work through
        conn.execute(text(
            "INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from, "
            "created_at, updated_at) SELECT id, workspace_id, '2026-10', '2026-10-01', '2026-10-31', '2026-10-31', "
            "'2026-11-01T00:00Z', '2026-11-01T00:00Z' FROM duty WHERE id % 97 < :tenants"), {"tenants": TENANTS})
        conn.execute(text("UPDATE duty SET last_dispatched_period = '2026-10' WHERE id % 97 < :tenants"),
                     {"tenants": TENANTS})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (ANALYZE) duty, task"))
    sessions = [TenantSession(database_url, n) for n in range(1, TENANTS + 1)]
    for session in sessions:
        session.start()
    time.sleep(5)
    for session in sessions:
        session.phase = "dispatch"
    child = subprocess.run([sys.executable, "-c", DISPATCH, database_url], cwd=PROJECT, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(PROJECT)}, timeout=900)
    for session in sessions:
        session.stopping.set()
    for session in sessions:
        session.join(timeout=30)
        session.conn.close()
    assert child.returncode == 0, child.stderr
    assert int(child.stdout.split()[-1]) >= 1_000_000

    assert [e for s in sessions for e in s.errors] == []
    idle = [x for s in sessions for x in s.latencies["idle"]]
    busy = [x for s in sessions for x in s.latencies["dispatch"]]
    assert len(idle) > 100 and len(busy) > 100
    acted = {task_id: at for s in sessions for task_id, at in s.acted.items()}
    with engine.connect() as conn:
        # The dispatcher moved no task's updated_at: those the tenants touched carry the
        # tenants' own instants, every other still has the one it was created with.
        moved = conn.execute(text(
            "SELECT id, updated_at FROM task WHERE updated_at <> created_at")).all()
        assert dict(moved) == acted
        assert conn.execute(text("SELECT count(*) FROM task WHERE status <> 'open'")).scalar_one() == len(acted)
    with capsys.disabled():
        print(f"\ntenant p99 latency: idle {p99(idle):.1f} ms over {len(idle)} operations, during the "
              f"1,000,000-duty dispatch {p99(busy):.1f} ms over {len(busy)} operations "
              f"(x{p99(busy) / p99(idle):.1f})")
