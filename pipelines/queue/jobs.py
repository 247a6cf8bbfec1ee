"""Jobs: registered by code, enabled by operators, and the runs a changed schedule no
longer fires."""

import json
from datetime import datetime, timedelta
from uuid import UUID

from sqlalchemy import ARRAY, BigInteger, Connection, Engine, bindparam, text

from rota.pipelines.queue.cron import InvalidCron, fire_times, validate_cron
from rota.pipelines.queue.transaction import transaction
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.queue")


_REGISTER_JOB = text(QUERIES["register_job"])


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


_QUEUED_FIRE_TIMES = text(QUERIES["queued_fire_times"]).bindparams(bindparam("job_ids", type_=ARRAY(BigInteger)))

_CANCEL_UNSCHEDULED = text(QUERIES["cancel_unscheduled"]).bindparams(bindparam("run_ids", type_=ARRAY(BigInteger)))


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
    schedule rota cannot read keeps its runs: it is reported where it is planned. A fire
    time the schedule owes again (the edit undone) is queued again when delivered."""
    with transaction(conn) as c:
        queued = c.execute(_QUEUED_FIRE_TIMES, {"job_ids": job_ids}).all()
        stale = [run_id for run_id, at, schedule, zone in queued if not _still_fires(schedule, zone, at)]
        if not stale:
            return 0
        return len(c.execute(_CANCEL_UNSCHEDULED, {"run_ids": stale}).all())
