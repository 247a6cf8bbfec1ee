"""The job queue: producing runs (each with an identity), and claiming them.

Producing is an insert whose identity conflict is an expected outcome, returned as a
value and never raised; any other failure propagates. Claiming is a separate concern:
nothing here that produces a run reads or writes claim or lease state.

`conn` is a SQLAlchemy Engine or Connection. With an Engine, or a Connection not inside
a transaction, each call commits its own transaction; inside the caller's transaction
it takes part in it and the caller commits.
"""

import json
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterator
from uuid import UUID

import psycopg
from sqlalchemy import ARRAY, BigInteger, Connection, Engine, Text, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from pipelines.cron import InvalidCron, fire_times, validate_cron
from pipelines.schema import MAX_REF_LENGTH

MAX_ERROR_LENGTH = 10_000


@dataclass(frozen=True)
class Enqueued:
    run_id: int


@dataclass(frozen=True)
class AlreadyQueued:
    run_id: int


@contextmanager
def transaction(conn: Connection | Engine) -> Iterator[Connection]:
    if isinstance(conn, Engine):
        with conn.begin() as connection:
            yield connection
    elif conn.in_transaction():
        yield conn
    else:
        with conn.begin():
            yield conn


def _aware(instant: datetime, name: str) -> datetime:
    if instant.tzinfo is None:
        raise ValueError(f"{name} {instant.isoformat()} has no UTC offset")
    return instant


# ---------------------------------------------------------------------------- jobs

# Code owns a job's shape (workspace, schedule, timezone, event type); the operator owns
# `enabled`, and `max_attempts` once raised. So an existing job is updated to code's shape,
# never enabled or disabled, and its max_attempts only ever raised. An unchanged job is
# found by the first CTE and not offered to the INSERT at all: the upsert would otherwise
# consume an identity value (and lock the row) on every call.
_REGISTER_JOB = text(
    """
    WITH offered AS (
        SELECT CAST(:name AS text) AS name, CAST(:workspace_id AS uuid) AS workspace_id,
               CAST(:schedule AS text) AS schedule, CAST(:timezone AS text) AS timezone,
               CAST(:event_type AS text) AS event_type, CAST(:enabled AS boolean) AS enabled,
               CAST(:max_attempts AS integer) AS max_attempts
    ),
    same AS (
        SELECT j.id FROM job j JOIN offered o ON j.name = o.name
        WHERE (j.workspace_id, j.schedule, j.timezone, j.event_type)
              IS NOT DISTINCT FROM (o.workspace_id, o.schedule, o.timezone, o.event_type)
    ),
    upserted AS (
        INSERT INTO job (name, workspace_id, schedule, timezone, event_type, enabled, max_attempts)
        SELECT * FROM offered WHERE NOT EXISTS (SELECT 1 FROM same)
        ON CONFLICT ON CONSTRAINT job_name_key DO UPDATE
        SET workspace_id = EXCLUDED.workspace_id, schedule = EXCLUDED.schedule,
            timezone = EXCLUDED.timezone, event_type = EXCLUDED.event_type
        RETURNING id
    )
    SELECT id, false FROM same UNION ALL SELECT id, true FROM upserted
    """
)


def check_text(value: str, field: str, row: str, max_length: int | None = None) -> None:
    """Refuse, naming the field and the row, text PostgreSQL cannot store (a NUL
    character, which it refuses without saying where) or that exceeds `max_length`."""
    if "\x00" in value:
        raise ValueError(f"{row}: {field} contains a NUL character")
    if max_length is not None and not 1 <= len(value) <= max_length:
        raise ValueError(f"{row}: {field} must be 1 to {max_length} characters, not {len(value)}")


def check_payload(payload: dict, row: str) -> None:
    """JSONB cannot hold U+0000 anywhere, in a key or a string value."""
    if "\\u0000" in json.dumps(payload):
        raise ValueError(f"{row}: payload contains a NUL character")


def register_job(
    conn: Connection | Engine,
    name: str,
    *,
    schedule: str | None = None,
    timezone: str = "UTC",
    event_type: str | None = None,
    enabled: bool = True,
    max_attempts: int = 5,
    workspace_id: UUID | None = None,
) -> int:
    """Create the job called `name`, or bring an existing one to this shape; returns its id.

    `enabled` and `max_attempts` are what a new job starts with: an existing job keeps the
    `enabled` and `max_attempts` an operator gave it (a Source registers its job at every
    poll, and must not undo an operator who lowered its retries). Queued runs
    of fire times the job's schedule no longer has are cancelled. An unchanged job is not
    written."""
    check_text(name, "name", f"job {name[:80]!r}", max_length=200)
    if schedule is not None:
        try:
            validate_cron(schedule)
        except InvalidCron as error:
            raise InvalidCron(f"job {name!r}: {error}") from None
    values = {"name": name, "workspace_id": workspace_id, "schedule": schedule, "timezone": timezone,
              "event_type": event_type, "enabled": enabled, "max_attempts": max_attempts}
    with transaction(conn) as c:
        job_id, written = c.execute(_REGISTER_JOB, values).one()
        if written:
            cancel_unscheduled_runs(c, [job_id])
        return job_id


_QUEUED_FIRE_TIMES = text(
    """
    SELECT q.id, q.scheduled_for, j.schedule, j.timezone
    FROM job_queue q JOIN job j ON j.id = q.job_id
    WHERE q.state = 'queued' AND q.attempts = 0 AND q.scheduled_for IS NOT NULL
      AND (CAST(:job_ids AS bigint[]) IS NULL OR q.job_id = ANY(:job_ids))
    """
).bindparams(bindparam("job_ids", type_=ARRAY(BigInteger)))

_CANCEL_UNSCHEDULED = text(
    """
    UPDATE job_queue
    SET state = 'cancelled', finished_at = now(), updated_at = now(),
        last_error = 'cancelled: the schedule of its job no longer fires at '
                     || to_char(scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
    WHERE id = ANY(:run_ids) AND state = 'queued' AND attempts = 0
    RETURNING id
    """
).bindparams(bindparam("run_ids", type_=ARRAY(BigInteger)))


def _still_fires(schedule: str | None, zone: str, at: datetime) -> bool:
    if schedule is None:
        return False
    try:
        return bool(fire_times(schedule, zone, at, at + timedelta(seconds=1)))
    except (InvalidCron, ValueError, LookupError):
        return True


def cancel_unscheduled_runs(conn: Connection | Engine, job_ids: list[int] | None = None) -> int:
    """Cancel the queued, never started runs of these jobs (default: every job) whose fire
    time their current schedule no longer has (an edited cron, or none at all); returns
    how many. A run claimed meanwhile is running, no longer queued, and is left alone. A
    schedule rota cannot read keeps its runs: it is reported where it is planned."""
    with transaction(conn) as c:
        queued = c.execute(_QUEUED_FIRE_TIMES, {"job_ids": job_ids}).all()
        stale = [run_id for run_id, at, schedule, zone in queued if not _still_fires(schedule, zone, at)]
        if not stale:
            return 0
        return len(c.execute(_CANCEL_UNSCHEDULED, {"run_ids": stale}).all())


# ---------------------------------------------------------------- scheduled runs

_ENQUEUE_SCHEDULED = text(
    """
    INSERT INTO job_queue (job_id, workspace_id, scheduled_for, run_at)
    VALUES (:job_id, (SELECT workspace_id FROM job WHERE id = :job_id), :scheduled_for, :scheduled_for)
    ON CONFLICT ON CONSTRAINT job_queue_schedule_identity DO NOTHING
    RETURNING id
    """
)
_FIND_SCHEDULED = text(
    "SELECT id FROM job_queue WHERE job_id = :job_id AND scheduled_for = :scheduled_for"
)


def enqueue_scheduled(conn: Connection | Engine, job_id: int, scheduled_for: datetime) -> Enqueued | AlreadyQueued:
    """Queue the run of `job_id` for the fire time `scheduled_for` (run_at = scheduled_for).

    A second call for the same pair meets `job_queue_schedule_identity` and returns
    AlreadyQueued with the existing run's id, however many schedulers race."""
    values = {"job_id": job_id, "scheduled_for": _aware(scheduled_for, "scheduled_for")}
    # Given an Engine, the INSERT is a transaction of its own (autocommit): no BEGIN and
    # COMMIT round trips around the one statement, on the path from a run's fire time to
    # its start.
    with (conn.connect().execution_options(isolation_level="AUTOCOMMIT") if isinstance(conn, Engine)
          else transaction(conn)) as c:
        run_id = c.execute(_ENQUEUE_SCHEDULED, values).scalar()
        if run_id is not None:
            return Enqueued(run_id)
        # A new statement, so a new snapshot: it sees the row that won the conflict.
        return AlreadyQueued(c.execute(_FIND_SCHEDULED, values).scalar_one())


# Arrays go as binary parameters (%b): psycopg's text dumping of ten thousand
# timestamps costs more than the insert, and racing producers pay it all at once.
_ENQUEUE_SCHEDULED_MANY = """
    WITH offered AS (
        SELECT * FROM unnest(%b::bigint[], %b::timestamptz[]) AS o(job_id, scheduled_for)
    )
    INSERT INTO job_queue (job_id, workspace_id, scheduled_for, run_at)
    SELECT o.job_id, j.workspace_id, o.scheduled_for, o.scheduled_for
    FROM offered o
    -- LEFT: an unknown job must reach job_queue_job_id_fkey and fail, not vanish
    LEFT JOIN job j ON j.id = o.job_id
    WHERE NOT EXISTS (
        SELECT 1 FROM job_queue q WHERE q.job_id = o.job_id AND q.scheduled_for = o.scheduled_for
    )
    ORDER BY o.job_id, o.scheduled_for
    ON CONFLICT ON CONSTRAINT job_queue_schedule_identity DO NOTHING
    RETURNING job_id
"""


# A racing producer waits at its first conflicting row until the winner commits, and one
# statement would then probe every remaining row against the winner's, one by one. So a
# short first statement meets any racer; the rest, in a new snapshot that holds the
# racer's committed rows, drops them as a set in the anti-join.
ENQUEUE_FIRST = 100


def enqueue_scheduled_many(conn: Connection | Engine, pairs: list[tuple[int, datetime]]) -> list[int]:
    """Queue many (job_id, fire time) runs in one transaction; returns the job id of
    each run created. Pairs that exist are filtered inside each statement (no identity
    value is consumed for them); ON CONFLICT guards against a racing producer. Every
    producer writes in the same order, so racing producers cannot deadlock."""
    if not pairs:
        return []
    ordered = sorted({(job_id, _aware(at, "scheduled_for")) for job_id, at in pairs})
    created = []
    with transaction(conn) as c:
        cursor = c.connection.driver_connection.cursor()
        for chunk in (ordered[:ENQUEUE_FIRST], ordered[ENQUEUE_FIRST:]):
            if not chunk:
                continue
            rows = cursor.execute(_ENQUEUE_SCHEDULED_MANY, ([job_id for job_id, _ in chunk],
                                                            [at for _, at in chunk])).fetchall()
            created.extend(job_id for (job_id,) in rows)
    return created


# ------------------------------------------------------------------- event runs

# Events not yet delivered, oldest first, each taken by one sensor (SKIP LOCKED), queued
# and marked in one statement. An event becomes visible when its transaction commits,
# however long that took, and is delivered by the first pass after that.
_DISPATCH_PENDING = text(
    """
    WITH pending AS MATERIALIZED (
        SELECT id FROM event WHERE dispatched_at IS NULL ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED
    ),
    queued AS (
        INSERT INTO job_queue (job_id, workspace_id, event_id, run_at, payload)
        SELECT j.id, coalesce(e.workspace_id, j.workspace_id), e.id, now(), e.payload
        FROM pending p
        JOIN event e ON e.id = p.id
        JOIN job j ON j.event_type = e.type AND j.enabled
                  AND (j.workspace_id IS NULL OR j.workspace_id = e.workspace_id)
        WHERE NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.event_id = e.id AND q.job_id = j.id)
        ORDER BY e.id, j.id
        ON CONFLICT ON CONSTRAINT job_queue_event_identity DO NOTHING
        RETURNING id
    ),
    marked AS (
        UPDATE event e SET dispatched_at = now() FROM pending p WHERE e.id = p.id RETURNING e.id
    )
    SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM queued)
    """
)


def dispatch_pending_events(conn: Connection | Engine, *, limit: int = 10_000) -> tuple[int, int]:
    """Deliver every committed event not delivered yet, `limit` at a time; returns
    (events delivered, runs created). Each event is delivered once, whenever its
    transaction committed; a pass with nothing pending writes nothing."""
    delivered = created = 0
    while True:
        with transaction(conn) as c:
            events, runs = c.execute(_DISPATCH_PENDING, {"limit": limit}).one()
        delivered, created = delivered + events, created + runs
        if events < limit:
            return delivered, created


# ------------------------------------------------------------------ source runs

# Offered rows that would change nothing (same payload, or a run that is no longer
# queued) are filtered out before the INSERT: ON CONFLICT DO UPDATE would otherwise lock
# the existing row and consume an identity value even when its WHERE refuses the update.
_PRODUCE_MANY = text(
    """
    WITH offered AS (
        SELECT * FROM unnest(:refs, :job_ids, :payloads) AS o(source_ref, job_id, payload)
    )
    INSERT INTO job_queue (job_id, workspace_id, source, source_ref, payload, run_at)
    SELECT o.job_id, (SELECT workspace_id FROM job WHERE id = o.job_id), :source, o.source_ref,
           o.payload, now()
    FROM offered o
    WHERE NOT EXISTS (
        SELECT 1 FROM job_queue q
        WHERE q.source = :source AND q.source_ref = o.source_ref
          AND (q.state <> 'queued' OR q.payload = o.payload)
    )
    ORDER BY o.source_ref
    ON CONFLICT ON CONSTRAINT job_queue_source_identity DO UPDATE
    SET payload = EXCLUDED.payload, updated_at = now()
    WHERE job_queue.state = 'queued' AND job_queue.payload IS DISTINCT FROM EXCLUDED.payload
    RETURNING source_ref, xmax = 0 AS created
    """
).bindparams(
    bindparam("refs", type_=ARRAY(Text)),
    bindparam("job_ids", type_=ARRAY(BigInteger)),
    bindparam("payloads", type_=ARRAY(JSONB)),
)

_JOB_IDS = text("SELECT name, id FROM job WHERE name = ANY(:names)").bindparams(
    bindparam("names", type_=ARRAY(Text))
)


@dataclass(frozen=True)
class Produced:
    """What producing did to each ref: created, refreshed (payload replaced while still
    queued) or unchanged (same payload, or the run is running or finished)."""

    outcomes: dict[str, str]

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)


def produce_many(conn: Connection | Engine, source: str, items: list[tuple[str, str, dict]]) -> Produced:
    """Produce runs from one source: items are (source_ref, job_name, payload). Upserts on
    `job_queue_source_identity`; a run that is running or finished is never modified; an
    identical second produce writes nothing at all."""
    if not source:
        raise ValueError("a source needs a name")
    check_text(source, "source", f"source {source[:80]!r}", max_length=200)
    latest = {ref: (job_name, payload) for ref, job_name, payload in items}
    for ref, (_, payload) in latest.items():
        row = f"source {source!r} ref {ref[:80]!r}"
        check_text(ref, "source_ref", row, max_length=MAX_REF_LENGTH)
        check_payload(payload, row)
    with transaction(conn) as c:
        names = sorted({job_name for job_name, _ in latest.values()})
        job_ids = dict(c.execute(_JOB_IDS, {"names": names}).all())
        unknown = [n for n in names if n not in job_ids]
        if unknown:
            raise LookupError(f"source {source!r}: no job named {', '.join(map(repr, unknown))}")
        refs = sorted(latest)
        returned = dict(c.execute(_PRODUCE_MANY, {
            "source": source,
            "refs": refs,
            "job_ids": [job_ids[latest[ref][0]] for ref in refs],
            "payloads": [latest[ref][1] for ref in refs],
        }).all())
    return Produced({ref: ("created" if returned[ref] else "refreshed") if ref in returned else "unchanged"
                     for ref in refs})


def produce(conn: Connection | Engine, source: str, source_ref: str, job_name: str, payload: dict) -> str:
    """Produce one run: returns "created", "refreshed" or "unchanged"."""
    return produce_many(conn, source, [(source_ref, job_name, payload)]).outcomes[source_ref]


# ----------------------------------------------------------------------- claims

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


# Records a worker's finished runs and claims its next ones in one statement (migration
# 0014's function, whose plan the server caches): one round trip and, on an autocommit
# connection, one transaction, where a busy worker otherwise paid BEGIN, two statements
# and COMMIT for every batch.
_COMPLETE_AND_CLAIM = """
    SELECT * FROM job_queue_complete_and_claim(
        %(finished)s::bigint[], %(worker)s::text, %(limit)s::integer, %(lease)s::double precision)
"""


def _fetch(conn: Connection | Engine | psycopg.Connection, statement: str, values: dict | None = None) -> list:
    """The rows of one psycopg-style statement, on a psycopg connection as it stands (in
    autocommit, its own transaction), else in `transaction(conn)`."""
    if isinstance(conn, psycopg.Connection):
        return conn.execute(statement, values).fetchall()
    with transaction(conn) as c:
        return c.connection.driver_connection.execute(statement, values).fetchall()


def claim_due_runs(conn: Connection | Engine, worker_id: str, limit: int, lease: timedelta) -> list[ClaimedRun]:
    """Claim up to `limit` due runs for `worker_id` with a lease. Runs locked by another
    claimer are skipped, not waited for. A run whose job was disabled after it was queued
    is cancelled here instead of being handed out."""
    return complete_and_claim(conn, worker_id, [], limit, lease)[1]


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


_EXTEND = text(
    """
    UPDATE job_queue SET lease_expires_at = now() + make_interval(secs => :lease), updated_at = now()
    WHERE id = ANY(:run_ids) AND state = 'running' AND lease_owner = :worker
    RETURNING id
    """
).bindparams(bindparam("run_ids", type_=ARRAY(BigInteger)))


def extend_leases(conn: Connection | Engine, worker_id: str, run_ids: list[int], lease: timedelta) -> set[int]:
    """Heartbeat: extend the leases `worker_id` still holds; returns the ids still held."""
    if not run_ids:
        return set()
    with transaction(conn) as c:
        return set(c.execute(_EXTEND, {"run_ids": run_ids, "worker": worker_id,
                                       "lease": lease.total_seconds()}).scalars())


def complete(conn: Connection | Engine, run_id: int, worker_id: str) -> bool:
    """Mark a held run succeeded; False if the lease was lost (the run was reclaimed)."""
    return run_id in complete_and_claim(conn, worker_id, [run_id], 0, timedelta(0))[0]


_FAIL = text(
    """
    UPDATE job_queue q
    SET state = CASE WHEN q.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        run_at = CASE WHEN q.attempts >= j.max_attempts THEN q.run_at
                 ELSE now() + make_interval(secs => least(:backoff * power(2, q.attempts - 1), :cap)) END,
        finished_at = CASE WHEN q.attempts >= j.max_attempts THEN now() END,
        lease_owner = NULL, lease_expires_at = NULL, last_error = :error, updated_at = now()
    FROM job j
    WHERE q.id = :run_id AND j.id = q.job_id AND q.state = 'running' AND q.lease_owner = :worker
    RETURNING q.state
    """
)


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
    backoff: timedelta = timedelta(seconds=5),
    cap: timedelta = timedelta(hours=1),
) -> str | None:
    """Record a failed attempt: retried after backoff * 2^(attempt-1) (capped), or
    `failed` once the job's max_attempts is spent. Returns the new state, or None if the
    lease was lost."""
    with transaction(conn) as c:
        return c.execute(_FAIL, {"run_id": run_id, "worker": worker_id, "error": clean_error(error),
                                 "backoff": backoff.total_seconds(), "cap": cap.total_seconds()}).scalar()


_RELEASE = text(
    """
    UPDATE job_queue
    SET state = 'queued', attempts = attempts - 1, lease_owner = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE id = ANY(:run_ids) AND state = 'running' AND lease_owner = :worker
    RETURNING id
    """
).bindparams(bindparam("run_ids", type_=ARRAY(BigInteger)))


def release(conn: Connection | Engine, worker_id: str, run_ids: list[int]) -> int:
    """Hand back claimed runs whose handler never started (their attempt is not counted)."""
    if not run_ids:
        return 0
    with transaction(conn) as c:
        return len(c.execute(_RELEASE, {"run_ids": run_ids, "worker": worker_id}).all())


_INTERRUPT = text(
    """
    UPDATE job_queue
    SET lease_expires_at = now() + make_interval(secs => :expires_in), last_error = :error, updated_at = now()
    WHERE id = :run_id AND state = 'running' AND lease_owner = :worker
    RETURNING id
    """
)


def interrupt(conn: Connection | Engine, run_id: int, worker_id: str, error: str, expires_in: timedelta) -> bool:
    """A worker about to exit with a handler still running: its lease on the run now ends
    `expires_in` from now, when the run is reclaimed (its attempt counted) and retried.
    The run is never handed on while the worker may still be executing it."""
    with transaction(conn) as c:
        return c.execute(_INTERRUPT, {"run_id": run_id, "worker": worker_id, "error": clean_error(error),
                                      "expires_in": expires_in.total_seconds()}).scalar() is not None


_RECLAIM = text(
    """
    UPDATE job_queue q
    SET state = CASE WHEN q.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        run_at = now(),
        finished_at = CASE WHEN q.attempts >= j.max_attempts THEN now() END,
        last_error = CASE WHEN q.last_error LIKE 'interrupted: worker ' || q.lease_owner || ' %' THEN q.last_error
                          ELSE 'lease of ' || q.lease_owner || ' expired at ' || q.lease_expires_at::text
                               || ' during attempt ' || q.attempts END,
        lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
    FROM job j
    WHERE q.state = 'running' AND q.lease_expires_at < now() AND j.id = q.job_id
    RETURNING q.state
    """
)


def reclaim_expired(conn: Connection | Engine) -> dict[str, int]:
    """Requeue runs whose worker stopped heartbeating (or fail them if their attempts are
    spent); returns counts by new state."""
    with transaction(conn) as c:
        states = c.execute(_RECLAIM).scalars().all()
    return {state: states.count(state) for state in set(states)}


# Workers LISTEN here; migration 0010's trigger notifies it once per statement that
# queues runs, when that statement's transaction commits.
RUNS_QUEUED_CHANNEL = "rota_runs_queued"

_NEXT_DUE = "SELECT extract(epoch FROM min(run_at) - now()) FROM job_queue WHERE state = 'queued'"


def seconds_until_next_run(conn: Connection | Engine | psycopg.Connection) -> float | None:
    """How long until the earliest queued run falls due (0 or less: it is due); None when
    nothing is queued."""
    ((due_in,),) = _fetch(conn, _NEXT_DUE)
    return None if due_in is None else float(due_in)


__all__ = [
    "AlreadyQueued", "ClaimedRun", "Enqueued", "Produced", "claim_due_runs", "complete", "complete_and_claim",
    "cancel_unscheduled_runs", "dispatch_pending_events", "enqueue_scheduled", "enqueue_scheduled_many",
    "extend_leases", "fail", "interrupt", "produce", "produce_many", "reclaim_expired", "register_job", "release",
    "seconds_until_next_run",
]
