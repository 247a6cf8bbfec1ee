"""Claiming runs, holding their leases, and settling them: completed, failed, released,
interrupted, or reclaimed when a lease expires."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

import psycopg
from sqlalchemy import ARRAY, BigInteger, Connection, Engine, bindparam, text

from rota.pipelines.queue.transaction import transaction
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.queue")

MAX_ERROR_LENGTH = 10_000


@dataclass(frozen=True)
class ClaimedRun:
    id: int
    job_id: int
    job_name: str
    workspace_id: UUID | None
    attempts: int
    max_attempts: int
    payload: dict
    scheduled_for: datetime | None
    event_id: int | None
    source: str | None
    source_ref: str | None


_COMPLETE_AND_CLAIM = QUERIES["complete_and_claim"]


def _fetch(conn: Connection | Engine | psycopg.Connection, statement: str, values: dict | None = None) -> list:
    """The rows of one psycopg-style statement, on a psycopg connection as it stands (in
    autocommit, its own transaction), else in `transaction(conn)`."""
    if isinstance(conn, psycopg.Connection):
        return conn.execute(statement, values).fetchall()
    with transaction(conn) as c:
        return c.connection.driver_connection.execute(statement, values).fetchall()


def complete_and_claim(conn: Connection | Engine | psycopg.Connection, worker_id: str, finished: list[int],
                       limit: int, lease: timedelta) -> tuple[set[int], list[ClaimedRun]]:
    """Mark the held runs `finished` succeeded and claim up to `limit` due runs, in one
    statement: a busy worker commits once per batch, not twice per run. Returns the
    finished runs recorded (one missing had lost its lease) and the runs claimed. `conn`
    may also be a psycopg connection, as a worker's own is: the statement then runs in
    that connection's transaction, or alone in autocommit."""
    values = {"finished": finished, "worker": worker_id, "limit": limit, "lease": lease.total_seconds()}
    rows = _fetch(conn, _COMPLETE_AND_CLAIM, values)
    recorded = set(rows[0][0] or ())
    return recorded, [ClaimedRun(*row[1:]) for row in rows if row[1] is not None]


_EXTEND = text(QUERIES["extend"]).bindparams(bindparam("run_ids", type_=ARRAY(BigInteger)))


def extend_leases(conn: Connection | Engine, worker_id: str, run_ids: list[int], lease: timedelta) -> set[int]:
    """Heartbeat: extend the leases `worker_id` still holds; returns the ids still held."""
    if not run_ids:
        return set()
    with transaction(conn) as c:
        return set(c.execute(_EXTEND, {"run_ids": run_ids, "worker": worker_id,
                                       "lease": lease.total_seconds()}).scalars())


_FAIL = text(QUERIES["fail"])


def clean_error(error: str) -> str:
    """Error text as PostgreSQL can store it: no NUL bytes, bounded length."""
    error = error.replace("\x00", "\\x00")
    return error if len(error) <= MAX_ERROR_LENGTH else error[: MAX_ERROR_LENGTH - 15] + "… (truncated)"


def fail(
    conn: Connection | Engine,
    run_id: int,
    worker_id: str,
    error: str,
    *,
    backoff: timedelta,
    cap: timedelta,
) -> str | None:
    """Record a failed attempt: retried after backoff * 2^(attempt-1) (capped), or
    `failed` once the job's max_attempts is spent. Returns the new state, or None if the
    lease was lost."""
    with transaction(conn) as c:
        return c.execute(_FAIL, {"run_id": run_id, "worker": worker_id, "error": clean_error(error),
                                 "backoff": backoff.total_seconds(), "cap": cap.total_seconds()}).scalar()


_RELEASE = text(QUERIES["release"]).bindparams(bindparam("run_ids", type_=ARRAY(BigInteger)))


def release(conn: Connection | Engine, worker_id: str, run_ids: list[int]) -> int:
    """Hand back claimed runs whose handler never started (their attempt is not counted)."""
    if not run_ids:
        return 0
    with transaction(conn) as c:
        return len(c.execute(_RELEASE, {"run_ids": run_ids, "worker": worker_id}).all())


_INTERRUPT = text(QUERIES["interrupt"])


def interrupt(conn: Connection | Engine, run_id: int, worker_id: str, error: str, expires_in: timedelta) -> bool:
    """A worker about to exit with a handler still running: its lease on the run now ends
    `expires_in` from now, when the run is reclaimed (its attempt counted) and retried.
    The run is never handed on while the worker may still be executing it."""
    with transaction(conn) as c:
        return c.execute(_INTERRUPT, {"run_id": run_id, "worker": worker_id, "error": clean_error(error),
                                      "expires_in": expires_in.total_seconds()}).scalar() is not None


_RECLAIM = text(QUERIES["reclaim"])


def reclaim_expired(conn: Connection | Engine) -> dict[str, int]:
    """Requeue runs whose worker stopped heartbeating (or fail them if their attempts are
    spent); returns counts by new state."""
    with transaction(conn) as c:
        states = c.execute(_RECLAIM).scalars().all()
    return {state: states.count(state) for state in set(states)}


_NEXT_DUE = QUERIES["next_due"]


def seconds_until_next_run(conn: Connection | Engine | psycopg.Connection) -> float | None:
    """How long until the earliest queued run falls due (0 or less: it is due); None when
    nothing is queued."""
    ((due_in,),) = _fetch(conn, _NEXT_DUE)
    return None if due_in is None else float(due_in)
