"""Shared test helpers: making duties, and proving that a run wrote nothing."""

import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from typing import NamedTuple

import psycopg

from sqlalchemy import Connection, Engine, create_engine, insert, make_url, select, text
from sqlalchemy.exc import DBAPIError

from rota.pipelines.dispatch.completeness import Gaps, find_gaps
from rota.pipelines.dispatch.planner import DutyRow, Plan
from rota.pipelines.dispatch.run import DispatchReport
from rota.pipelines.queue.claims import ClaimedRun, complete_and_claim
from rota.pipelines.queue.worker import Worker
from rota.pipelines.queue.worker_settings import WorkerSettings
from rota.resources.database.schema import duty, task
from rota.resources.database.server import driver_url, libpq_url


def duty_values(workspace_id=None, **overrides) -> dict:
    values = {
        "workspace_id": workspace_id or uuid.uuid4(),
        "title": "Water the plants",
        "kind": "recurring",
        "frequency": "monthly",
        "timezone": "UTC",
        "lead_days": 0,
        "effective_from": None,
        "effective_to": None,
        "state": "active",
    }
    values.update(overrides)
    if values["kind"] == "standing":
        values["frequency"] = overrides.get("frequency")
    return values


# Tests judge runs at instants long before the test made its duties: as the owner, the
# helpers backdate eligible_since so the checks judge those duties at any instant.
OWED_ALL_ALONG = datetime(2000, 1, 1, tzinfo=timezone.utc)


def insert_duties(engine: Engine, rows: list[dict]) -> list[int]:
    with engine.begin() as conn:
        return list(conn.execute(insert(duty).returning(duty.c.id),
                                 [_owed(row) for row in rows]).scalars())


def _owed(row: dict) -> dict:
    """eligible_since=None leaves it to the database, as a tenant's insert does."""
    row = {"eligible_since": OWED_ALL_ALONG, **row}
    if row["eligible_since"] is None:
        del row["eligible_since"]
    return row


def add_duty(engine: Engine, **overrides) -> int:
    return insert_duties(engine, [duty_values(**overrides)])[0]


def duty_row(id: int = 1, **overrides) -> DutyRow:
    values = duty_values(**overrides)
    del values["title"], values["workspace_id"]
    return DutyRow(id=id, **values)


class TaskRow(NamedTuple):
    """Identity first, so sorting rows sorts them in identity order."""

    duty_id: int
    period_key: str
    period_start: date
    due_date: date
    visible_from: date


def planned_tasks(page_plan: Plan) -> list[TaskRow]:
    """A plan's slices expanded into the task rows the writer makes of them in SQL, in
    identity order."""
    rows = [TaskRow(s.duty_id, *period) for s, period in page_plan.tasks()]
    rows.sort()
    return rows


def task_keys(engine: Engine, duty_id: int | None = None) -> list[str]:
    query = select(task.c.period_key).order_by(task.c.period_key)
    if duty_id is not None:
        query = query.where(task.c.duty_id == duty_id)
    with engine.connect() as conn:
        return list(conn.execute(query).scalars())


def keys_by_duty(engine: Engine) -> dict[int, list[str]]:
    with engine.connect() as conn:
        rows = conn.execute(select(task.c.duty_id, task.c.period_key).order_by(task.c.duty_id, task.c.period_key))
        result: dict[int, list[str]] = {}
        for duty_id, key in rows:
            result.setdefault(duty_id, []).append(key)
        return result


def last_dispatched(engine: Engine, duty_id: int) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(duty.c.last_dispatched_period).where(duty.c.id == duty_id)).scalar_one()


def database_fingerprint(engine: Engine) -> dict:
    """Every user table's row versions (ctid and xmin change on any write, even an update
    to the same value) and every sequence's value. `pg_stat` counters arrive seconds late
    and cannot prove that nothing was written."""
    fingerprint = {}
    with engine.connect() as conn:
        tables = conn.execute(text(
            "SELECT relname FROM pg_class WHERE relkind = 'r' "
            "AND relnamespace = 'public'::regnamespace ORDER BY relname"
        )).scalars().all()
        for table in tables:
            fingerprint[table] = conn.execute(text(
                f"SELECT count(*), coalesce(md5(string_agg(ctid::text || ':' || xmin::text, ',' "
                f"ORDER BY ctid)), '') FROM {table}"
            )).one()
        sequences = conn.execute(text(
            "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' ORDER BY 1"
        )).scalars().all()
        for sequence in sequences:
            fingerprint[f"sequence {sequence}"] = conn.execute(
                text(f"SELECT last_value, is_called FROM {sequence}")
            ).one()
    return fingerprint


def rows_only(fingerprint: dict) -> dict:
    """A refused INSERT written by hand has drawn identity values before the row was
    checked; sequences are not transactional, so only the rows can stay untouched."""
    return {name: value for name, value in fingerprint.items() if not name.startswith("sequence ")}


def tenant(database_url: str, workspace_id: uuid.UUID | None) -> psycopg.Connection:
    """A tenant session of its own (never pooled): role rota_app, whose password, if the
    server asks for one, is ROTA_APP_PASSWORD; with rota.workspace_id set unless None."""
    url = make_url(database_url).set(username="rota_app", password=os.environ.get("ROTA_APP_PASSWORD"))
    conn = psycopg.connect(libpq_url(url.render_as_string(hide_password=False)), autocommit=True)
    if workspace_id is not None:
        conn.execute("SELECT set_config('rota.workspace_id', %s, false)", (str(workspace_id),))
    return conn


def run_while_held(session: psycopg.Connection, work, bound: float):
    """Run `work` on another thread while `session` holds its open transaction; return
    what it returned once it finishes, failing if it is still running after `bound`
    seconds. The session's transaction is rolled back either way, so a `work` that waited
    on it ends too."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = work()
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(bound)
    still_running = worker.is_alive()
    holding = session.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    session.rollback()
    worker.join(120)
    assert not still_running, f"the work waited on the tenant's open transaction for more than {bound} s"
    assert holding, "the tenant's transaction ended before the work did"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def race_processes(target, args: tuple, count: int = 8, timeout: float = 120) -> list:
    """Start `count` spawned processes running target(*args, barrier, results): each warms
    its connection, waits at the barrier so all start together, and puts one outcome."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(count), context.Queue()
    processes = [context.Process(target=target, args=(*args, barrier, results)) for _ in range(count)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=timeout) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    return outcomes


def wait_until_blocked_by(engine: Engine, blocker: Connection, what: str, timeout: float = 20) -> None:
    """Return once some session waits on a lock `blocker` holds: a sleep would only
    guess that the other side got that far."""
    pid = blocker.execute(text("SELECT pg_backend_pid()")).scalar_one()
    deadline = time.monotonic() + timeout
    with engine.connect() as observer:
        while not observer.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"),
                {"pid": pid}).scalar_one():
            assert time.monotonic() < deadline, f"{what} never waited"
            observer.rollback()  # pg_stat_activity is a snapshot per transaction
            time.sleep(0.05)


def record_outcome(work, outcome: dict, refused: type[Exception] = DBAPIError) -> None:
    """A thread's target: run `work`; `outcome` gets `result`, what it returned, or `error`,
    the message of the `refused` it raised."""
    try:
        outcome["result"] = work()
    except refused as error:
        outcome["error"] = str(error)


def outcome_once_released(engine: Engine, blocker: Connection, what: str, work,
                          refused: type[Exception] = DBAPIError) -> dict:
    """Start `work` on another thread, let it wait on a lock `blocker` holds, commit
    `blocker`, and return what `work` came to (record_outcome's `result` or `error`)."""
    outcome: dict = {}
    thread = threading.Thread(target=record_outcome, args=(work, outcome, refused))
    thread.start()
    wait_until_blocked_by(engine, blocker, what)
    blocker.commit()
    thread.join(timeout=30)
    return outcome


def delete_duty_with_its_tasks(engine: Engine, duty_id: int) -> None:
    """Delete a duty's tasks, then the duty, in one transaction."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM task WHERE duty_id = :d"), {"d": duty_id})
        conn.execute(text("DELETE FROM duty WHERE id = :d"), {"d": duty_id})


def claim_due_runs(conn, worker_id: str, limit: int, lease: timedelta) -> list[ClaimedRun]:
    """Claim up to `limit` due runs with nothing to report finished: a worker's first call."""
    return complete_and_claim(conn, worker_id, [], limit, lease)[1]


def complete(conn, run_id: int, worker_id: str) -> bool:
    """Mark a held run succeeded, as a worker's next claim reports it; False if the lease
    was lost (the run was reclaimed)."""
    return run_id in complete_and_claim(conn, worker_id, [run_id], 0, timedelta(0))[0]


@contextmanager
def worker_in_a_thread(database_url: str, settings: WorkerSettings) -> Iterator[list[float]]:
    """An in-process worker on an engine of its own, stopped on leaving; yields the list of
    monotonic times it believed a lease lost."""
    gave_up: list[float] = []
    worker_engine = create_engine(driver_url(database_url))
    worker = Worker(worker_engine, settings, on_lease_lost=lambda: gave_up.append(time.monotonic()))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        yield gave_up
    finally:
        worker.stopping.set()
        thread.join(timeout=30)
        worker_engine.dispose()


def gaps_after(engine: Engine, report: DispatchReport) -> Gaps:
    """The gaps the rules see after the run `report` describes."""
    return find_gaps(engine, frequency=report.frequency, mode=report.mode, as_of=report.as_of,
                     requested=report.requested)
