"""rota behind a real PgBouncer in transaction mode: consecutive transactions of one client
land on whichever server connection is free, and a server connection passes from client
to client with whatever session state it holds."""

import os
import time
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import make_url, text

from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.planner import plan
from rota.pipelines.dispatch.reading import read_pages
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.periods.calendar import parse_instant
from rota.pipelines.queue.enqueue import enqueue_scheduled_many
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import produce_many
from rota.resources.database.engine import make_engine
from tests.helpers import add_duty, duty_values, gaps_after, insert_duties, keys_by_duty, planned_tasks, race_processes
from tests.pgbouncer import pgbouncer
from tests.dispatch.test_dispatch import ZONES, months
from tests.queue.test_queue import runs, start_worker, stop, wait_for

AS_OF = "2026-11-20T00:00:00Z"


@pytest.fixture
def bouncer(test_server):
    passwords = {test_server.role: psycopg.conninfo.conninfo_to_dict(test_server.rota_url).get("password"),
                 "rota_app": os.environ.get("ROTA_APP_PASSWORD")}
    with pgbouncer(test_server.rota_url, passwords, pool_size=1) as through:
        yield through


def _pid_and_rows(conn, workspace=None):
    with conn.transaction():
        if workspace:
            conn.execute("SELECT set_config('rota.workspace_id', %s, true)", (str(workspace),))
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        return pid, conn.execute("SELECT count(*) FROM duty").fetchone()[0]


def test_a_tenants_workspace_never_reaches_the_next_pooled_client(database_url, engine, bouncer):
    """SPEC section 2's pattern, set_config(..., true) inside the tenant's transaction, ends
    with the transaction; the session form (false) would hand tenant A's workspace to the
    next client of the same server connection, which the second half shows."""
    add_duty(engine)
    with engine.connect() as conn:
        workspace = conn.execute(text("SELECT workspace_id FROM duty")).scalar_one()
    tenant_url = make_url(bouncer(database_url)).set(username="rota_app").render_as_string(hide_password=False)
    with psycopg.connect(tenant_url, prepare_threshold=None) as a, \
            psycopg.connect(tenant_url, prepare_threshold=None) as b:
        a_pid, seen_by_a = _pid_and_rows(a, workspace)
        b_pid, seen_by_b = _pid_and_rows(b)
        assert (seen_by_a, seen_by_b) == (1, 0)
        assert a_pid == b_pid  # one server connection served both clients
        with a.transaction():
            a.execute("SELECT set_config('rota.workspace_id', %s, false)", (str(workspace),))
        leaked_pid, leaked = _pid_and_rows(b)
        assert leaked_pid == a_pid and leaked == 1  # the session form leaks: why SPEC forbids it


def _died(workers) -> str:
    return "\n".join(w.stdout.read()[-1500:] for w in workers if w.poll() is not None)


def test_a_worker_drains_runs_and_a_dispatch_completes_through_pgbouncer(database_url, engine, bouncer):
    pooled = bouncer(database_url)
    rows = [duty_values(timezone=ZONES[i % len(ZONES)], lead_days=(i * 7) % 40, title=f"duty {i}")
            for i in range(3000)]
    insert_duties(engine, rows)
    requested = months("2026-01", "2026-11")
    expected = set()
    for page in read_pages(engine, "monthly", 20_000):
        page_plan = plan(page, frequency="monthly", mode=Mode.SCHEDULED, as_of=parse_instant(AS_OF),
                         requested=requested)
        expected |= {(t.duty_id, t.period_key) for t in planned_tasks(page_plan)}
    through = make_engine(pooled, pool_size=4, max_overflow=4)
    try:
        for _ in range(3):  # the first pass writes, the others find everything made
            report = dispatch(through, frequency="monthly", mode=Mode.SCHEDULED, as_of=parse_instant(AS_OF),
                              requested=requested, page_size=500, writers=3)
            assert not report.unplannable and not gaps_after(through, report).count
    finally:
        through.dispose()
    made = {(duty_id, key) for duty_id, keys in keys_by_duty(engine).items() for key in keys}
    assert made == expected and len(made) >= 3000

    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))
    register_job(engine, "count", max_attempts=1)
    workers = [start_worker(pooled, "--poll", "0.02") for _ in range(2)]
    try:
        # Idle polls first: two workers executing one statement again and again, which
        # psycopg would prepare under one name on whichever server connection each got.
        time.sleep(3)
        assert all(w.poll() is None for w in workers), _died(workers)
        produce_many(engine, "test", [(f"r{n}", "count", {"n": n}) for n in range(200)])
        wait_for(lambda: all(r["state"] == "succeeded" for r in runs(engine))
                 or any(w.poll() is not None for w in workers), 120, "two workers to drain 200 runs through PgBouncer")
        assert all(w.poll() is None for w in workers), _died(workers)
    finally:
        outcomes = [stop(w) for w in workers]
    assert [code for code, _ in outcomes] == [0, 0], outcomes
    assert [r["state"] for r in runs(engine)] == ["succeeded"] * 200
    assert not any("prepared statement" in output for _, output in outcomes)
    with engine.connect() as conn:  # exactly once: every run's handler ran, and ran once
        assert conn.execute(text("SELECT count(*), count(DISTINCT run_id), max(attempt) FROM handler_call")).one() \
            == (200, 200, 1)


def _enqueue_through(url, job_id, barrier, results):
    engine = make_engine(url, pool_size=1)
    fire_times = [parse_instant(AS_OF) + timedelta(minutes=n) for n in range(1000)]
    barrier.wait()
    try:
        # Again and again: psycopg would prepare a statement it runs five times.
        results.put([len(enqueue_scheduled_many(engine, [(job_id, t) for t in fire_times])) for _ in range(6)])
    except Exception as error:  # reported to the parent, which fails the test
        results.put(repr(error))
    finally:
        engine.dispose()


def test_producers_racing_through_pgbouncer_queue_each_fire_time_once(test_server, database_url, engine):
    """Four producers at once, each on a server connection of its own (a pool of four), each
    sending enqueue_scheduled_many's two statements in one pipeline, six times over."""
    passwords = {test_server.role: psycopg.conninfo.conninfo_to_dict(test_server.rota_url).get("password")}
    job_id = register_job(engine, "report", schedule="* * * * *")
    with pgbouncer(test_server.rota_url, passwords, pool_size=4) as through:
        outcomes = race_processes(_enqueue_through, (through(database_url), job_id), count=4)
    assert all(isinstance(o, list) for o in outcomes), outcomes
    assert sum(map(sum, outcomes)) == 1000
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*), count(DISTINCT scheduled_for) FROM job_queue")).one() == (1000, 1000)
