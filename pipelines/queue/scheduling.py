"""Which fire times a scheduled-runs materialisation enqueues. Pure: job rows, a window
and an instant in; fire times out."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rota.pipelines.queue.cron import fire_times


@dataclass(frozen=True)
class ScheduledJob:
    id: int
    name: str
    schedule: str
    timezone: str
    # When its fire times became owed (registered, re-enabled, re-scheduled).
    scheduled_since: datetime


@dataclass
class FirePlan:
    due: list[tuple[int, datetime]] = field(default_factory=list)
    # Fire times a live run found older than the catch-up window, owed since the job's
    # scheduled_since: left for a backfill. Earlier ones were never owed and are not listed.
    stale: list[tuple[int, datetime]] = field(default_factory=list)
    unplannable: dict[int, str] = field(default_factory=dict)


def plan_fire_times(
    jobs: list[ScheduledJob],
    start: datetime,
    end: datetime,
    *,
    as_of: datetime,
    catch_up: timedelta | None,
) -> FirePlan:
    """Every fire time in [start, end) of every job. A backfill queues every fire time it
    is asked for. Live delivery (with `catch_up`) queues only those the job owes, from its
    scheduled_since on (a job registered at 03:01 owes nothing at 03:00, inside the
    catch-up window too), and sets aside as stale the owed ones older than
    `as_of - catch_up`."""
    result = FirePlan()
    oldest = as_of - catch_up if catch_up is not None else None
    for job in jobs:
        try:
            times = fire_times(job.schedule, job.timezone, start, end)
        except Exception as error:  # one bad job must not stop the others
            result.unplannable[job.id] = f"job {job.name!r}: {error}"
            continue
        for at in times:
            if oldest is not None and at < job.scheduled_since:
                continue
            if oldest is None or at >= oldest:
                result.due.append((job.id, at))
            else:
                result.stale.append((job.id, at))
    return result


def live_hours(now: datetime, catch_up: timedelta, lookahead: timedelta) -> list[datetime]:
    """Hour starts a live evaluation at `now` requests: every hour still inside the
    catch-up window, up to the hour `lookahead` reaches, so runs are queued ahead of
    their fire times (with run_at = scheduled_for)."""
    first = (now - catch_up).replace(minute=0, second=0, microsecond=0)
    last = (now + lookahead).replace(minute=0, second=0, microsecond=0)
    hours = []
    while first <= last:
        hours.append(first)
        first += timedelta(hours=1)
    return hours
