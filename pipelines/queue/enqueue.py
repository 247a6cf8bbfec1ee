"""Enqueueing a job's scheduled fire times, each run once by its identity.

An identity conflict is an expected outcome, returned as a value and never raised; any
other failure propagates. Nothing that produces a run reads or writes claim or lease
state."""

from dataclasses import dataclass
from datetime import datetime, timezone

from psycopg import Cursor
from sqlalchemy import Connection, Engine, text

from rota.pipelines.queue.transaction import transaction
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.queue")


@dataclass(frozen=True)
class Enqueued:
    run_id: int


@dataclass(frozen=True)
class AlreadyQueued:
    run_id: int


def _aware(instant: datetime, name: str) -> datetime:
    if not isinstance(instant, datetime):
        raise TypeError(f"{name} {instant!r} is not a datetime")
    if instant.utcoffset() is None:
        raise ValueError(f"{name} {instant.isoformat()} has no UTC offset")
    return instant


_ENQUEUE_SCHEDULED = text(QUERIES["enqueue_scheduled"])
_FIND_SCHEDULED = text(QUERIES["find_scheduled"])
_ANNOUNCE = QUERIES["announce_queued_runs"]


def enqueue_scheduled(conn: Connection | Engine, job_id: int, scheduled_for: datetime) -> Enqueued | AlreadyQueued:
    """Queue the run of `job_id` for the fire time `scheduled_for` (run_at = scheduled_for).

    A second call for the same pair meets `job_queue_schedule_identity` and returns
    AlreadyQueued with the existing run's id, however many schedulers race. A run its
    schedule cancelled (a cron edit, since undone, so the fire time is owed again) is
    queued again: Enqueued, with that run's id."""
    values = {"job_id": job_id, "scheduled_for": _aware(scheduled_for, "scheduled_for")}
    # Given an Engine, the INSERT is a transaction of its own (autocommit): no BEGIN and
    # COMMIT round trips around the one statement, on the path from a run's fire time to
    # its start.
    with (conn.connect().execution_options(isolation_level="AUTOCOMMIT") if isinstance(conn, Engine)
          else transaction(conn)) as c:
        row = c.execute(_ENQUEUE_SCHEDULED, values).first()
        if row is not None:
            if row.queued_again:
                c.exec_driver_sql(_ANNOUNCE)
            return Enqueued(row.id)
        # A new statement, so a new snapshot: it sees the row that won the conflict.
        return AlreadyQueued(c.execute(_FIND_SCHEDULED, values).scalar_one())


_ENQUEUE_SCHEDULED_MANY = QUERIES["enqueue_scheduled_many"]
_ANY_UNSCHEDULED = QUERIES["any_unscheduled"]
_QUEUE_AGAIN_MANY = QUERIES["queue_again_many"]


# A racing producer waits at its first conflicting row until the winner commits, and one
# statement would then probe every remaining row against the winner's, one by one. So a
# short first statement meets any racer; the rest, a second statement with a new snapshot
# that holds the racer's committed rows, drops them as a set in the anti-join.
ENQUEUE_FIRST = 100


def enqueue_scheduled_many(conn: Connection | Engine, pairs: list[tuple[int, datetime]]) -> list[int]:
    """Queue many (job_id, fire time) runs in one transaction; returns the job id of
    each run created, or queued again after its schedule cancelled it (as
    enqueue_scheduled does). Pairs that exist are filtered inside each statement (no identity
    value is consumed for them); ON CONFLICT guards against a racing producer. Every
    producer queues again, then inserts, in the same order, so racing producers cannot
    deadlock."""
    if not pairs:
        return []
    # dict.fromkeys keeps the callers' order, which is usually sorted already: timsort then
    # takes one pass, where sorting a set's scrambled order cost racing producers 4 ms each.
    ordered = sorted(dict.fromkeys(_in_utc(pairs)))
    with transaction(conn) as c:
        driver = c.connection.driver_connection
        created = _queue_again(driver.cursor(), ordered)
        if created:
            driver.execute(_ANNOUNCE)
        # Both statements go in one pipeline: a racing producer's second is dumped and
        # handed to the socket before its first waits on the winner, so the server reads
        # and runs it the moment the first ends, with no round trip and none of the woken
        # losers' Python between the two (docs/perf.md, enqueue_race).
        with driver.pipeline():
            cursors = []
            for chunk in (ordered[:ENQUEUE_FIRST], ordered[ENQUEUE_FIRST:]):
                if chunk:
                    cursors.append(driver.cursor())
                    cursors[-1].execute(_ENQUEUE_SCHEDULED_MANY, _columns(chunk))
            for cursor in cursors:
                created.extend(job_id for (job_id,) in cursor.fetchall())
    return created


def _in_utc(pairs: list[tuple[int, datetime]]) -> list[tuple[int, datetime]]:
    """`pairs` with each fire time as its instant in UTC: two datetimes of one zone compare
    by the wall clock, fold ignored, so 01:30 before and after a fall-back would be one key.
    Pairs already in UTC, as plan_fire_times gives them, are returned as they are: a new
    tuple per pair cost each racing producer 1.3 ms (docs/perf.md, enqueue_race)."""
    for _, at in pairs:
        if not (isinstance(at, datetime) and at.tzinfo is timezone.utc):
            return [(job_id, _aware(at, "scheduled_for").astimezone(timezone.utc)) for job_id, at in pairs]
    return pairs


def _queue_again(cursor: Cursor, ordered: list[tuple[int, datetime]]) -> list[int]:
    """The job ids of the runs among `ordered` that their schedule had cancelled, queued
    again; the second statement only when the index says there are some."""
    jobs = list(dict.fromkeys(job_id for job_id, _ in ordered))
    if not cursor.execute(_ANY_UNSCHEDULED, (jobs,)).fetchone()[0]:
        return []
    return [job_id for (job_id,) in cursor.execute(_QUEUE_AGAIN_MANY, _columns(ordered)).fetchall()]


def _columns(pairs: list[tuple[int, datetime]]) -> tuple[list[int], list[datetime]]:
    return [job_id for job_id, _ in pairs], [at for _, at in pairs]
