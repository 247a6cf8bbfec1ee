"""`rota worker`: claims one due run at a time, executes its handler, heartbeats its lease.

A worker holds a lease only on the run it is about to execute, so one slow handler never
holds up runs another worker could take. A run is never executed by two workers at once:
- the lease is renewed while the handler runs; if the worker cannot confirm it before it
  could expire (the database is away, or the run was reclaimed), the worker process exits
  at once, handler and all, before any other worker can be handed the run;
- past the grace period after SIGTERM, the worker shortens the run's lease to a few
  seconds and exits; the run is reclaimed (the attempt counted) only once the lease has
  run out, when this process is long gone.

On SIGTERM it stops claiming, lets the handler in progress finish within the grace
period, hands back a run it claimed but never started, and exits 0."""

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import psycopg
from psycopg import OperationalError as DriverOperationalError
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from pipelines.handlers import HANDLERS
from pipelines.queue import (
    RUNS_QUEUED_CHANNEL,
    ClaimedRun,
    claim_due_runs,
    complete,
    extend_leases,
    fail,
    interrupt,
    reclaim_expired,
    release,
    seconds_until_next_run,
)
from resources.server import libpq_url

# A lost database surfaces through SQLAlchemy, or through a raw psycopg cursor.
DATABASE_GONE = (OperationalError, DriverOperationalError)

log = logging.getLogger(__name__)

# How often the heartbeat and the watchdog look at the run in hand.
WATCH_INTERVAL = 0.25
# The exit status of a worker that stopped its handler because it could no longer prove
# it held the run's lease (EX_TEMPFAIL: run it again).
LEASE_LOST_EXIT = 75


@dataclass
class WorkerSettings:
    lease: timedelta = timedelta(seconds=30)
    poll_interval: float = 0.5
    grace: timedelta = timedelta(seconds=20)
    backoff: timedelta = timedelta(seconds=5)
    backoff_cap: timedelta = timedelta(hours=1)
    reclaim_interval: float = 5.0
    # Past the grace period, the run in hand is reclaimable this long after the worker left.
    interrupted_lease: timedelta = timedelta(seconds=3)
    # Wake on the NOTIFY of newly queued runs instead of only polling: a run queued for
    # now starts in milliseconds, not up to poll_interval later. Polling stays, so a lost
    # notification (a PgBouncer in transaction mode delivers none) costs latency only.
    listen: bool = True


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _exit_now() -> None:
    logging.shutdown()
    os._exit(LEASE_LOST_EXIT)


class Worker:
    """`on_lease_lost` is called when the run in hand may be handed to another worker while
    its handler still runs here; the default ends the process, which is the only way to
    stop a handler mid-flight. Embedders that run handlers elsewhere may pass their own."""

    def __init__(self, engine: Engine, settings: WorkerSettings | None = None, worker_id: str | None = None,
                 on_lease_lost: Callable[[], None] = _exit_now):
        self.engine = engine
        self.settings = settings or WorkerSettings()
        self.id = worker_id or default_worker_id()
        self.stopping = threading.Event()
        self.on_lease_lost = on_lease_lost
        self._done = threading.Event()
        self._current: ClaimedRun | None = None
        # When the lease of the run in hand was last confirmed (monotonic, taken before the
        # statement that granted or renewed it, so never later than the database's now()).
        self._confirmed = 0.0
        self._next_reclaim = 0.0
        self._listener: psycopg.Connection | None = None

    def _heartbeat(self) -> None:
        """Renew the lease of the run in hand at a third of its length."""
        lease = self.settings.lease.total_seconds()
        while not self._done.wait(WATCH_INTERVAL):
            run, confirmed = self._current, self._confirmed
            if run is None or time.monotonic() < confirmed + lease / 3:
                continue
            asked = time.monotonic()
            try:
                kept = extend_leases(self.engine, self.id, [run.id], self.settings.lease)
            except Exception:
                log.exception("heartbeat failed; retrying")
                self._done.wait(WATCH_INTERVAL * 4)
                continue
            if self._current is not run:
                continue
            if run.id not in kept:
                self._stop_handler(run, "was lost (reclaimed by another worker)")
                return
            self._confirmed = asked

    def _watchdog(self) -> None:
        """Stop the worker before the lease of the run in hand could expire unconfirmed:
        a renewal may hang (a lock, a dead connection) as well as fail."""
        lease = self.settings.lease.total_seconds()
        while not self._done.wait(WATCH_INTERVAL):
            run, confirmed = self._current, self._confirmed
            if run is not None and time.monotonic() - confirmed > lease * 5 / 6:
                self._stop_handler(run, f"could not be renewed for {time.monotonic() - confirmed:.1f} s")
                return

    def _stop_handler(self, run: ClaimedRun, why: str) -> None:
        log.critical("the lease of run %d %s; stopping this worker and its handler so that no other "
                     "worker runs it at the same time", run.id, why)
        self.on_lease_lost()

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
        """Past the grace period: the run in progress becomes reclaimable a few seconds
        from now, by which time this process has exited (the attempt counts, and the run
        is retried)."""
        current = self._current
        if current is not None:
            interrupt(self.engine, current.id, self.id,
                      f"interrupted: worker {self.id} was stopped and its grace period ran out",
                      self.settings.interrupted_lease)

    def run(self) -> None:
        """Work until `stopping` is set. A lost database is logged as an error and waited
        out, with backoff: the worker carries on when it returns, and a run it could not
        record is reclaimed when its lease expires."""
        for name, target in (("heartbeat", self._heartbeat), ("watchdog", self._watchdog)):
            threading.Thread(target=target, name=name, daemon=True).start()
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
                    self.stopping.wait(wait)
        finally:
            self._close_listener()
            self._done.set()

    def _listen(self) -> psycopg.Connection | None:
        if self._listener is None and self.settings.listen:
            try:
                url = self.engine.url.render_as_string(hide_password=False)
                self._listener = psycopg.connect(libpq_url(url), autocommit=True)
                self._listener.execute(f"LISTEN {RUNS_QUEUED_CHANNEL}")
            except psycopg.Error as error:
                log.warning("cannot listen for queued runs (%s); polling every %.2f s",
                            str(error).strip().splitlines()[0], self.settings.poll_interval)
                self._close_listener()
        return self._listener

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _wait_for_work(self) -> None:
        """Nothing was due: sleep until the earliest queued run falls due, a statement
        queues runs (its NOTIFY), or poll_interval has passed, whichever comes first."""
        listener = self._listen()  # before the look: a run queued after it is announced
        wait = self.settings.poll_interval
        due_in = seconds_until_next_run(self.engine)
        if due_in is not None:
            wait = max(0.0, min(wait, due_in))
        if listener is None or wait == 0:
            self.stopping.wait(wait)
            return
        deadline = time.monotonic() + wait
        try:
            # In slices, so that a stop request is seen within WATCH_INTERVAL.
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                if list(listener.notifies(timeout=min(left, WATCH_INTERVAL), stop_after=1)):
                    return
        except psycopg.Error:
            log.warning("the connection listening for queued runs broke; it is opened again at the next wait")
            self._close_listener()

    def _work_once(self) -> None:
        now = time.monotonic()
        if now >= self._next_reclaim:
            reclaimed = reclaim_expired(self.engine)
            if reclaimed:
                log.info("reclaimed expired leases: %s", reclaimed)
            self._next_reclaim = now + self.settings.reclaim_interval
        asked = time.monotonic()
        runs = claim_due_runs(self.engine, self.id, 1, self.settings.lease)
        if not runs:
            self._wait_for_work()
            return
        run = runs[0]
        if self.stopping.is_set():
            release(self.engine, self.id, [run.id])
            log.info("handed back run %d, claimed as the worker was stopping", run.id)
            return
        self._confirmed, self._current = asked, run
        try:
            self._execute(run)
        finally:
            self._current = None
