"""`rota worker`: claims due runs, executes their handlers, heartbeats their leases.

On SIGTERM it stops claiming, lets the handler in progress finish within the grace
period, hands back the runs it claimed but never started, and exits 0. Past the grace
period it hands back the run in progress too (it will be retried) and exits."""

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Engine
from psycopg import OperationalError as DriverOperationalError
from sqlalchemy.exc import OperationalError

# A lost database surfaces through SQLAlchemy, or through a raw psycopg cursor.
DATABASE_GONE = (OperationalError, DriverOperationalError)

from pipelines.handlers import HANDLERS
from pipelines.queue import (
    ClaimedRun,
    claim_due_runs,
    complete,
    extend_leases,
    fail,
    reclaim_expired,
    release,
)

log = logging.getLogger(__name__)


@dataclass
class WorkerSettings:
    batch: int = 10
    lease: timedelta = timedelta(seconds=30)
    poll_interval: float = 0.5
    grace: timedelta = timedelta(seconds=20)
    backoff: timedelta = timedelta(seconds=5)
    backoff_cap: timedelta = timedelta(hours=1)
    reclaim_interval: float = 5.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(self, engine: Engine, settings: WorkerSettings | None = None, worker_id: str | None = None):
        self.engine = engine
        self.settings = settings or WorkerSettings()
        self.id = worker_id or default_worker_id()
        self.stopping = threading.Event()
        self._held: set[int] = set()
        self._held_lock = threading.Lock()
        self._done = threading.Event()
        self._current: ClaimedRun | None = None
        self._next_reclaim = 0.0

    # The lease is renewed at a third of its length, so two missed beats still hold it.
    def _heartbeat(self) -> None:
        interval = self.settings.lease.total_seconds() / 3
        while not self._done.wait(interval):
            with self._held_lock:
                held = sorted(self._held)
            try:
                kept = extend_leases(self.engine, self.id, held, self.settings.lease)
            except Exception:
                log.exception("heartbeat failed; retrying at the next beat")
                continue
            lost = set(held) - kept
            if lost:
                log.warning("leases lost (reclaimed by another worker): %s", sorted(lost))

    def _execute(self, run: ClaimedRun) -> None:
        function = HANDLERS.get(run.job_name)
        try:
            if function is None:
                raise LookupError(f"no handler is registered for job {run.job_name!r}")
            function(run, self.engine)
        except Exception:
            state = fail(self.engine, run.id, self.id, traceback.format_exc(),
                         backoff=self.settings.backoff, cap=self.settings.backoff_cap)
            log.warning("run %d of %s failed (attempt %d/%d) -> %s", run.id, run.job_name,
                        run.attempts, run.max_attempts, state or "lease lost")
        else:
            try:
                finished = complete(self.engine, run.id, self.id)
            except DATABASE_GONE:
                log.error("run %d of %s finished, but the database went away before that was recorded; "
                          "it will be reclaimed and run again when its lease expires", run.id, run.job_name)
                raise
            if not finished:
                log.warning("run %d finished after its lease was lost; it will be run again", run.id)

    def abandon(self) -> None:
        """Past the grace period: the run in progress counts as a failed attempt (it is
        retried after backoff), the rest are handed back."""
        current = self._current
        if current is not None:
            fail(self.engine, current.id, self.id,
                 f"interrupted: worker {self.id} was stopped and its grace period ran out",
                 backoff=timedelta(0), cap=timedelta(0))
        self.hand_back_everything()

    def hand_back_everything(self) -> int:
        with self._held_lock:
            held = sorted(self._held)
            self._held.clear()
        return release(self.engine, self.id, held)

    def run(self) -> None:
        """Work until `stopping` is set; then hand back what was never started. A lost
        database is logged as an error and waited out, with backoff: the worker carries
        on when it returns, and a run it could not record is reclaimed when its lease
        expires."""
        beat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        beat.start()
        outage = 0
        try:
            while not self.stopping.is_set():
                try:
                    self._work_once()
                    outage = 0
                except DATABASE_GONE as error:
                    outage += 1
                    wait = min(self.settings.poll_interval * 2 ** outage, 30.0)
                    log.error("the database went away (%s); retrying in %.1f s",
                              str(getattr(error, "orig", error)).strip().splitlines()[0], wait)
                    self._current = None
                    with self._held_lock:
                        self._held.clear()  # their leases expire and reclaim hands them on
                    self.stopping.wait(wait)
        finally:
            self._done.set()
            try:
                released = self.hand_back_everything()
            except DATABASE_GONE:
                log.error("could not hand back claimed runs, the database is away; they are "
                          "reclaimed when their leases expire")
            else:
                if released:
                    log.info("handed back %d claimed runs that never started", released)

    def _work_once(self) -> None:
        now = time.monotonic()
        if now >= self._next_reclaim:
            reclaimed = reclaim_expired(self.engine)
            if reclaimed:
                log.info("reclaimed expired leases: %s", reclaimed)
            self._next_reclaim = now + self.settings.reclaim_interval
        runs = claim_due_runs(self.engine, self.id, self.settings.batch, self.settings.lease)
        if not runs:
            self.stopping.wait(self.settings.poll_interval)
            return
        with self._held_lock:
            self._held.update(r.id for r in runs)
        for run in runs:
            if self.stopping.is_set():
                break
            self._current = run
            self._execute(run)
            self._current = None
            with self._held_lock:
                self._held.discard(run.id)
