"""`rota worker`: claims due runs for its idle handler slots, executes them, heartbeats
their leases.

A worker claims only as many runs as it has idle slots (`concurrency`, one by default)
and starts each at once, so one slow handler never holds up runs another worker or slot
could take. A busy worker records the runs it finished and claims the next ones in one
transaction. A run is never executed by two workers at once:
- the leases of the runs in hand are renewed while their handlers run; if the worker
  cannot confirm one before it could expire (the database is away, or the run was
  reclaimed), the worker process exits at once, handlers and all, before any other worker
  can be handed the run;
- past the grace period after SIGTERM, the worker shortens its runs' leases to a few
  seconds and exits; a run is reclaimed (the attempt counted) only once its lease has
  run out, when this process is long gone;
- renewing the leases failing for any reason but the database (a bug) ends the worker the
  same way, its traceback logged, with its own exit status (worker_exits.py).

On SIGTERM it stops claiming, lets the handlers in progress finish within the grace
period, hands back a run it claimed but never started, and exits 0."""

import logging
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import psycopg
from sqlalchemy import Engine

from rota.pipelines.queue.claims import (
    ClaimedRun,
    complete_and_claim,
    extend_leases,
    fail,
    interrupt,
    reclaim_expired,
    release,
    seconds_until_next_run,
)
from rota.pipelines.queue.handlers import HANDLERS
from rota.pipelines.queue.worker_exits import BUG_EXIT, DATABASE_GONE, exit_for_bug, exit_lease_lost, may_pass
from rota.pipelines.queue.worker_settings import WorkerSettings, default_worker_id
from rota.resources.database.queries import queries
from rota.resources.database.server import libpq_url

QUERIES = queries("rota.pipelines.queue")

log = logging.getLogger(__name__)

# How often the heartbeat and the watchdog look at the run in hand.
WATCH_INTERVAL = 0.25
# How soon a free handler slot is filled (or a success recorded) at the latest, while
# other handlers still run.
HANDLER_WATCH = 0.01
# A worker whose last wake-up by a notification found nothing to claim (another worker
# took the run) claims this much later at the next one. Every idle worker hears every
# notification; without this they all claim at once, and on a small machine the one that
# wins waits for the CPU the others spend losing. The worker that won keeps answering at
# once; the others still claim what it leaves, a moment later.
LOST_RACE_DELAY = 0.002


class Worker:
    """`on_lease_lost` is called when a run in hand may be handed to another worker while
    its handler still runs here, `on_bug` when renewing leases failed other than by the
    database going away; each default ends the process, the only way to stop a handler
    mid-flight. Embedders that run handlers elsewhere may pass their own."""

    def __init__(self, engine: Engine, settings: WorkerSettings | None = None, worker_id: str | None = None,
                 on_lease_lost: Callable[[], None] = exit_lease_lost, on_bug: Callable[[], None] = exit_for_bug):
        self.engine = engine
        self.settings = settings or WorkerSettings()
        if self.settings.concurrency < 1:
            raise ValueError(f"a worker's concurrency must be at least 1, not {self.settings.concurrency}")
        self.id = worker_id or default_worker_id()
        self.stopping = threading.Event()
        self.on_lease_lost = on_lease_lost
        self.on_bug = on_bug
        self._done = threading.Event()
        self._lock = threading.Lock()
        # The runs whose handlers are executing, and when each one's lease was last confirmed
        # (monotonic, taken before the statement that granted or renewed it, so never later
        # than the database's now()).
        self._running: dict[int, ClaimedRun] = {}
        self._confirmed: dict[int, float] = {}
        # Runs whose handlers returned, to be recorded with the next claim.
        self._finished: list[ClaimedRun] = []
        # Held while finished runs are being recorded, so a process exiting past its grace
        # period records what the claiming loop has not, after what it has in flight.
        self._recording = threading.Lock()
        self._slot_freed = threading.Event()
        self._waiting_since: float | None = None
        self._handlers = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="handler")
        self._next_reclaim = 0.0
        # The claiming loop's own connection (see _connection).
        self._own: psycopg.Connection | None = None
        self._listening = False
        # Whether the last wait ended with a notification, and whether the claim after the
        # last such wait came back empty.
        self._notified = False
        self._lost_race = False

    def _in_hand(self) -> dict[int, float]:
        with self._lock:
            return dict(self._confirmed)

    def _heartbeat(self) -> None:
        """Renew the leases of the runs in hand once the oldest confirmation is a third of a
        lease old."""
        lease = self.settings.lease.total_seconds()
        while not self._done.wait(WATCH_INTERVAL):
            confirmed = self._in_hand()
            if not confirmed or time.monotonic() < min(confirmed.values()) + lease / 3:
                continue
            asked = time.monotonic()
            try:
                kept = extend_leases(self.engine, self.id, list(confirmed), self.settings.lease)
            except Exception as error:
                if may_pass(error):
                    log.exception("heartbeat failed; retrying")
                    self._done.wait(WATCH_INTERVAL * 4)
                    continue
                # Retrying a bug fails the same way until the leases run out, and the worker
                # then exits as if another had taken its runs: the bug would go unseen.
                self._stop_for_bug(error)
                return
            with self._lock:
                # A run that left the hand meanwhile finished; only one still executing is lost.
                lost = [run_id for run_id in confirmed if run_id not in kept and run_id in self._running]
                for run_id in kept & self._confirmed.keys():
                    self._confirmed[run_id] = asked
            if lost:
                self._stop_handlers(lost, "was lost (reclaimed by another worker)")
                return

    def _watchdog(self) -> None:
        """Stop the worker before the lease of a run in hand could expire unconfirmed: a
        renewal may hang (a lock, a dead connection) as well as fail."""
        lease = self.settings.lease.total_seconds()
        while not self._done.wait(WATCH_INTERVAL):
            confirmed = self._in_hand()
            if not confirmed:
                continue
            oldest = min(confirmed, key=confirmed.__getitem__)
            if (age := time.monotonic() - confirmed[oldest]) > lease * 5 / 6:
                self._stop_handlers([oldest], f"could not be renewed for {age:.1f} s")
                return

    def _stop_handlers(self, run_ids: list[int], why: str) -> None:
        log.critical("the lease of run %s %s; stopping this worker and its handlers so that no other "
                     "worker runs it at the same time", ", ".join(map(str, run_ids)), why)
        # Within the sixth of a lease the watchdog leaves before any run in hand can expire.
        self.record_before_exit(within=min(2.0, self.settings.lease.total_seconds() / 12))
        self.on_lease_lost()

    def _stop_for_bug(self, error: Exception) -> None:
        log.critical("renewing the leases of the runs in hand failed, not because the database went away: a bug "
                     "in rota; stopping this worker and its handlers (exit status %d)", BUG_EXIT, exc_info=error)
        self.stopping.set()  # a run claimed now would go to a worker on its way out
        try:
            # The message's first line only: a driver's error may carry a statement and its
            # parameters, and the whole traceback is in the log.
            said = (str(error).strip().splitlines() or [""])[0][:200]
            self.abandon(f"stopped: renewing its leases failed ({type(error).__name__}: {said}), a bug "
                         "in rota; see the worker's log")
        finally:
            self.on_bug()

    def _leave_hand(self, run: ClaimedRun, succeeded: bool) -> None:
        with self._lock:
            self._running.pop(run.id, None)
            self._confirmed.pop(run.id, None)
            if succeeded:
                self._finished.append(run)
        self._slot_freed.set()

    def _execute(self, run: ClaimedRun) -> None:
        """On a handler thread. A success is recorded by the claiming loop, with its next
        claim; a failure here, at once, as it schedules the retry."""
        try:
            function = HANDLERS.get(run.job_name)
            try:
                if function is None:
                    raise LookupError(f"no handler is registered for job {run.job_name!r}")
                function(run, self.engine)
            except Exception:
                # The handler has returned, so its lease needs no renewal; recording the
                # failure clears the lease, which a heartbeat must not take for one lost.
                self._leave_hand(run, succeeded=False)
                state = fail(self.engine, run.id, self.id, traceback.format_exc(),
                             backoff=self.settings.backoff, cap=self.settings.backoff_cap)
                log.warning("run %d of %s failed (attempt %d/%d) -> %s", run.id, run.job_name,
                            run.attempts, run.max_attempts, state or "lease lost")
            else:
                self._leave_hand(run, succeeded=True)
        except Exception as error:
            log.error("run %d of %s failed, and recording that failed too (%s); it will be reclaimed and "
                      "run again when its lease expires", run.id, run.job_name,
                      str(getattr(error, "orig", error)).strip().splitlines()[0])
        finally:
            self._leave_hand(run, succeeded=False)

    def abandon(self, why: str = "was stopped and its grace period ran out") -> None:
        """Past the grace period (or stopped by a bug): the runs whose handlers returned are
        recorded, and those still in progress become reclaimable a few seconds from now, by
        which time this process has exited (the attempts count; `why` is their error)."""
        self.record_before_exit(within=2.0)
        with self._lock:
            in_hand = list(self._running)
        for run_id in in_hand:
            interrupt(self.engine, run_id, self.id, f"interrupted: worker {self.id} {why}",
                      self.settings.interrupted_lease)

    def record_before_exit(self, within: float) -> None:
        """Record the runs whose handlers returned, before the process exits by any path
        other than the claiming loop's own end, so that none of them runs again. Bounded:
        on a connection of its own (the loop's belongs to its thread), after any record the
        loop has in flight, within `within` seconds; what cannot be recorded by then is
        logged, and runs again after its lease."""
        holding = self._recording.acquire(timeout=within)
        try:
            with self._lock:
                finished, self._finished = self._finished, []
            if not finished:
                return
            url = libpq_url(self.engine.url.render_as_string(hide_password=False))
            with psycopg.connect(url, prepare_threshold=None, connect_timeout=max(1, round(within))) as conn:
                with conn.transaction():
                    conn.execute(QUERIES["limit_statement_time"], {"milliseconds": str(round(within * 1000))})
                    recorded, _ = complete_and_claim(conn, self.id, [run.id for run in finished], 0,
                                                     self.settings.lease)
            self._log_unrecorded(finished, recorded)
        except Exception as error:
            for run in finished:
                log.error("run %d of %s finished, but it could not be recorded before the worker exited (%s); "
                          "it will be reclaimed and run again when its lease expires", run.id, run.job_name,
                          str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
        finally:
            if holding:
                self._recording.release()

    def _log_unrecorded(self, finished: list[ClaimedRun], recorded: set[int]) -> None:
        for run in finished:
            if run.id not in recorded:
                log.warning("run %d finished after its lease was lost; it will be run again", run.id)

    def run(self) -> None:
        """Work until `stopping` is set, then let the handlers in progress finish. A lost
        database is logged as an error and waited out, with backoff: the worker carries on
        when it returns, and a run it could not record is reclaimed when its lease expires."""
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
                    self.stopping.wait(wait)
        finally:
            # Each run whose handler returns while the others finish is recorded as it
            # returns: past the grace period the process exits without waiting for the rest.
            while self._in_hand():
                self._slot_freed.wait(WATCH_INTERVAL)
                self._slot_freed.clear()
                self._record_finished()
            self._handlers.shutdown(wait=True)
            self._record_finished()
            self._close_connection()
            self._done.set()

    def _record_finished(self) -> None:
        try:
            self._record_and_claim(0)
        except DATABASE_GONE:
            pass  # each run left unrecorded was logged; its lease runs out and it runs again

    def _connection(self) -> psycopg.Connection:
        """The claiming loop's own connection, outside the engine's pool and in autocommit:
        its record-and-claim is one statement, so one round trip, with no checkout, ping,
        BEGIN or COMMIT around it. It also LISTENs for queued runs (a notification that
        arrives during a claim waits in psycopg's backlog for the next wait). Opened again
        after the database went away."""
        if self._own is None or self._own.closed:
            url = self.engine.url.render_as_string(hide_password=False)
            # No server-side prepared statements, as on the engine: PgBouncer (resources.database.engine).
            self._own = psycopg.connect(libpq_url(url), autocommit=True, prepare_threshold=None)
            self._listening = False
            if self.settings.listen:
                try:
                    self._own.execute(QUERIES["listen_for_queued_runs"])
                    self._listening = True
                except DATABASE_GONE:
                    raise
                except psycopg.Error as error:
                    log.warning("cannot listen for queued runs (%s); polling every %.2f s",
                                str(error).strip().splitlines()[0], self.settings.poll_interval)
        return self._own

    def _close_connection(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None

    def _wait_for_work(self) -> None:
        """Nothing was due: sleep until the earliest queued run falls due, a statement
        queues runs (its NOTIFY), a handler returns, or poll_interval has passed, whichever
        comes first."""
        connection = self._connection()
        # Listening since before the look below: a run queued after it is announced.
        listener = connection if self._listening else None
        wait = self.settings.poll_interval
        due_in = seconds_until_next_run(connection)
        if due_in is not None:
            wait = max(0.0, min(wait, due_in))
        # In slices, so that a stop request is seen within WATCH_INTERVAL, and a returning
        # handler's success is recorded within HANDLER_WATCH.
        piece = HANDLER_WATCH if self._running else WATCH_INTERVAL
        deadline = time.monotonic() + wait
        try:
            while not (self.stopping.is_set() or self._slot_freed.is_set()) \
                    and (left := deadline - time.monotonic()) > 0:
                if listener is None:
                    self._slot_freed.wait(min(left, piece))
                elif list(listener.notifies(timeout=min(left, piece), stop_after=1)):
                    if self._lost_race:
                        self.stopping.wait(LOST_RACE_DELAY)
                    self._notified = True
                    return
        except psycopg.Error:
            log.warning("the connection listening for queued runs broke; it is opened again at the next claim")
            self._close_connection()

    def _record_and_claim(self, free: int) -> list[ClaimedRun]:
        """Record the runs finished since the last call and claim up to `free` due runs."""
        with self._recording:
            with self._lock:
                finished, self._finished = self._finished, []
            if not finished and not free:
                return []
            try:
                recorded, runs = complete_and_claim(self._connection(), self.id, [run.id for run in finished], free,
                                                    self.settings.lease)
            except DATABASE_GONE:
                self._close_connection()
                for run in finished:
                    log.error("run %d of %s finished, but the database went away before that was recorded; "
                              "it will be reclaimed and run again when its lease expires", run.id, run.job_name)
                raise
        self._log_unrecorded(finished, recorded)
        return runs

    def _work_once(self) -> None:
        now = time.monotonic()
        if now >= self._next_reclaim:
            reclaimed = reclaim_expired(self.engine)
            if reclaimed:
                log.info("reclaimed expired leases: %s", reclaimed)
            self._next_reclaim = now + self.settings.reclaim_interval
        self._slot_freed.clear()
        with self._lock:
            running, finished = len(self._running), len(self._finished)
        free = self.settings.concurrency - running
        if not free and not finished:
            self._slot_freed.wait(WATCH_INTERVAL)
            return
        # A round trip as each handler returns would make batches of one: while handlers
        # still run, wait for them up to HANDLER_WATCH from the first free slot.
        if running and not self.stopping.is_set():
            if self._waiting_since is None:
                self._waiting_since = time.monotonic()
            if (left := self._waiting_since + HANDLER_WATCH - time.monotonic()) > 0:
                self._slot_freed.wait(left)
                return
        self._waiting_since = None
        asked = time.monotonic()
        runs = self._record_and_claim(free)
        if self._notified:
            self._notified, self._lost_race = False, not runs
        if runs and self.stopping.is_set():
            release(self.engine, self.id, [run.id for run in runs])
            log.info("handed back run %s, claimed as the worker was stopping", ", ".join(str(r.id) for r in runs))
            return
        with self._lock:
            for run in runs:
                self._running[run.id], self._confirmed[run.id] = run, asked
        for run in runs:
            self._handlers.submit(self._execute, run)
        # Fewer due runs than free slots: nothing more is due now, so do not ask again.
        if len(runs) < free:
            self._wait_for_work()
