"""The job queue as an operator sees and steers it (SPEC §6): its state per job, its
failed runs with their errors, and the two actions an operator takes on runs, retrying a
failed one and cancelling a queued one, each recorded on the run's row.

Free of Dagster (pipelines/queue/view.py shows and runs these from the UI). Every
statement here reads or locks through an index whose leading column is `state`
(job_queue_claim_idx), so reading the state costs what is queued, running or recent, not
the table's whole history."""

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import ARRAY, BigInteger, Connection, Engine, bindparam, text

from rota.pipelines.queue.transaction import transaction
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.queue")

# The claim latency is measured over runs that fell due this recently.
LATENCY_WINDOW = timedelta(hours=1)
FAILED_WINDOW = timedelta(days=1)
SHOWN_FAILURES = 20

_STATE = text(QUERIES["state"]).bindparams(failed_window=FAILED_WINDOW, latency_window=LATENCY_WINDOW)

_FAILURES = text(QUERIES["failures"]).bindparams(failed_window=FAILED_WINDOW, shown=SHOWN_FAILURES)


@dataclass(frozen=True)
class JobState:
    job: str
    queued: int
    due: int
    running: int
    failed_last_day: int
    failed_last_hour: int
    oldest_waiting_seconds: float
    claim_latency_p95_seconds: float | None


@dataclass(frozen=True)
class FailedRun:
    run_id: int
    job: str
    attempts: int
    finished_at: object
    error: str | None


@dataclass(frozen=True)
class QueueState:
    jobs: list[JobState]
    failures: list[FailedRun] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(getattr(job, name) for job in self.jobs)

    @property
    def oldest_waiting_seconds(self) -> float:
        return max((job.oldest_waiting_seconds for job in self.jobs), default=0.0)


def read_queue_state(conn: Connection | Engine) -> QueueState:
    with transaction(conn) as c:
        jobs = [JobState(name, queued, due, running, failed_day, failed_hour, float(oldest),
                         None if p95 is None else float(p95))
                for name, queued, due, running, failed_day, failed_hour, oldest, p95 in c.execute(_STATE)]
        failures = [FailedRun(*row) for row in c.execute(_FAILURES)]
    return QueueState(jobs, failures)


class NotActionable(ValueError):
    """Runs an action cannot apply to: none of the action's runs was changed."""


_LOCK = text(QUERIES["lock"]).bindparams(
    bindparam("ids", type_=ARRAY(BigInteger)))

_RETRY = text(QUERIES["retry"]).bindparams(bindparam("ids", type_=ARRAY(BigInteger)))

_CANCEL = text(QUERIES["cancel"]).bindparams(bindparam("ids", type_=ARRAY(BigInteger)))


@dataclass(frozen=True)
class Operated:
    retried: list[int]
    cancelled: list[int]


def operate(conn: Connection | Engine, *, retry: list[int], cancel: list[int], by: str) -> Operated:
    """Retry failed runs and cancel queued ones, all or none: the runs are locked first (a
    worker's claim skips a locked run), and any that does not exist or is not in the state
    its action needs is named in the refusal, with nothing changed. `by` is the Dagster
    run that acts, recorded on each row."""
    retry, cancel = sorted(set(retry)), sorted(set(cancel))
    both = sorted(set(retry) & set(cancel))
    if both:
        raise NotActionable(f"runs {both} are named both to retry and to cancel; nothing was changed")
    if not retry and not cancel:
        raise NotActionable("no runs named: give their ids in retry or cancel")
    with transaction(conn) as c:
        states = dict(c.execute(_LOCK, {"ids": retry + cancel}).all())
        wrong = [f"run {run_id} is {states[run_id]}, not {wanted} ({action})" if run_id in states
                 else f"run {run_id} does not exist ({action})"
                 for action, wanted, ids in (("retry", "failed", retry), ("cancel", "queued", cancel))
                 for run_id in ids if states.get(run_id) != wanted]
        if wrong:
            raise NotActionable(f"nothing was changed: {'; '.join(wrong)}")
        retried = sorted(c.execute(_RETRY, {"ids": retry, "by": by}).scalars()) if retry else []
        cancelled = sorted(c.execute(_CANCEL, {"ids": cancel, "by": by}).scalars()) if cancel else []
    return Operated(retried, cancelled)
