"""The job queue against a real PostgreSQL: identities, races, claims and workers."""

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
import pytest
from sqlalchemy import create_engine, insert, text
from sqlalchemy.exc import IntegrityError, OperationalError

from rota.pipelines.queue.claims import complete_and_claim, fail, reclaim_expired
from rota.pipelines.queue.enqueue import QUERIES as QUEUE_QUERIES
from rota.pipelines.queue.enqueue import AlreadyQueued, Enqueued, enqueue_scheduled, enqueue_scheduled_many
from rota.pipelines.queue.events import dispatch_pending_events
from rota.pipelines.queue.jobs import register_job
from rota.resources.database.schema import event
from rota.resources.database.server import driver_url, libpq_url
from tests.helpers import claim_due_runs, complete, database_fingerprint, race_processes, tenant

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 8, 31, 20, 0, tzinfo=timezone.utc)


def runs(engine, where="true"):
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT * FROM job_queue WHERE {where} ORDER BY id")).mappings().all()


def add_event(engine, type_, workspace_id=None, payload=None):
    with engine.begin() as conn:
        return conn.execute(insert(event).returning(event.c.id),
                            {"type": type_, "workspace_id": workspace_id, "payload": payload or {}}).scalar_one()


def test_a_second_enqueue_of_one_fire_time_returns_the_existing_run(engine):
    job_id = register_job(engine, "report", schedule="0 * * * *")
    first = enqueue_scheduled(engine, job_id, T0)
    assert isinstance(first, Enqueued)
    assert enqueue_scheduled(engine, job_id, T0) == AlreadyQueued(first.run_id)
    with engine.connect() as conn:  # a Connection outside a transaction commits its own
        assert enqueue_scheduled(conn, job_id, T0 + timedelta(hours=1)).__class__ is Enqueued
    with engine.connect() as conn, conn.begin():  # inside the caller's transaction
        assert enqueue_scheduled(conn, job_id, T0) == AlreadyQueued(first.run_id)
    assert len(runs(engine)) == 2
    (row,) = runs(engine, f"id = {first.run_id}")
    assert (row["scheduled_for"], row["run_at"], row["state"], row["event_id"]) == (T0, T0, "queued", None)


def test_a_fire_time_a_cron_edit_cancelled_is_queued_again_when_enqueued_again(engine):
    """The schedule went to :30 and back: 20:00 is owed again, and its run (the same one)
    is queued; a second enqueue finds it queued."""
    job_id = register_job(engine, "report", schedule="0 * * * *")
    first = enqueue_scheduled(engine, job_id, T0)
    register_job(engine, "report", schedule="30 * * * *")
    assert runs(engine)[0]["state"] == "cancelled"
    register_job(engine, "report", schedule="0 * * * *")
    assert enqueue_scheduled(engine, job_id, T0) == Enqueued(first.run_id)
    assert enqueue_scheduled(engine, job_id, T0) == AlreadyQueued(first.run_id)
    (row,) = runs(engine)
    assert (row["state"], row["attempts"], row["finished_at"], row["last_error"]) == ("queued", 0, None, None)


def test_a_fire_time_is_its_instant_whatever_zone_or_fold_it_is_written_in(engine):
    """The fall-back hour's 01:30 in New York, before and after the clocks go back, are two
    fire times an hour apart (Python compares and hashes them as one wall-clock time), and
    the second written in UTC is the same fire time again."""
    job_id = register_job(engine, "report", schedule="30 * * * *")
    first = datetime(2026, 11, 1, 1, 30, fold=0, tzinfo=ZoneInfo("America/New_York"))
    second = first.replace(fold=1)
    assert len(enqueue_scheduled_many(engine, [(job_id, second), (job_id, first),
                                               (job_id, second.astimezone(timezone.utc))])) == 2
    assert [row["scheduled_for"] for row in runs(engine)] == [datetime(2026, 11, 1, 5, 30, tzinfo=timezone.utc),
                                                              datetime(2026, 11, 1, 6, 30, tzinfo=timezone.utc)]


def test_enqueue_refuses_a_naive_fire_time_and_raises_other_errors(engine):
    job_id = register_job(engine, "report", schedule="0 * * * *")
    with pytest.raises(ValueError, match="no UTC offset"):
        enqueue_scheduled(engine, job_id, datetime(2026, 8, 31, 20))
    with pytest.raises(ValueError, match=r"^scheduled_for 2026-08-31T21:00:00 has no UTC offset$"):
        enqueue_scheduled_many(engine, [(job_id, T0), (job_id, datetime(2026, 8, 31, 21))])
    with pytest.raises(TypeError, match=r"^scheduled_for datetime.date\(2026, 8, 31\) is not a datetime$"):
        enqueue_scheduled_many(engine, [(job_id, T0), (job_id, T0.date())])
    with pytest.raises(ValueError, match="unpack"):
        enqueue_scheduled_many(engine, [(job_id, T0), (job_id, T0, "stray")])
    with pytest.raises(Exception, match="job_queue_job_id_fkey"):
        enqueue_scheduled(engine, job_id + 1000, T0)
    with pytest.raises(Exception, match="job_queue_job_id_fkey"):
        enqueue_scheduled_many(engine, [(job_id, T0), (job_id + 1000, T0)])
    # The unknown job sorts last, into the second of the two statements sent together:
    # its error is raised and the first statement's runs are rolled back with it.
    with pytest.raises(Exception, match="job_queue_job_id_fkey"):
        enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(150)]
                               + [(job_id + 1000, T0)])
    assert runs(engine) == []


def test_an_enqueue_given_an_engine_hands_its_connection_back_out_of_autocommit(database_url, caplog):
    """enqueue_scheduled(engine) runs its statement in autocommit; whatever it returns or
    raises, the next user of that pooled connection gets a transaction again, so a
    rolled-back block writes nothing; on an engine made for autocommit, it stays in
    autocommit (docs/perf.md: a faster enqueue once forced it out). Errors are
    SQLAlchemy's, as through any Connection, and a connection that broke under it is
    dropped from the pool quietly, so the next call gets a new one."""
    engine = create_engine(driver_url(database_url), pool_size=1, max_overflow=0)
    try:
        job_id = register_job(engine, "report", schedule="0 * * * *")
        with engine.connect() as conn:
            backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with psycopg.connect(libpq_url(database_url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (backend,))
        with pytest.raises(OperationalError):
            enqueue_scheduled(engine, job_id, T0 - timedelta(hours=1))
        assert "Exception during reset" not in caplog.text
        assert isinstance(enqueue_scheduled(engine, job_id, T0), Enqueued)
        assert isinstance(enqueue_scheduled(engine, job_id, T0), AlreadyQueued)
        with pytest.raises(IntegrityError, match="job_queue_job_id_fkey"):
            enqueue_scheduled(engine, job_id + 1000, T0)
        with engine.connect() as conn:
            assert conn.connection.driver_connection.autocommit is False
        with pytest.raises(RuntimeError, match="rolled back"):
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO job_queue (job_id, scheduled_for, run_at) VALUES (:j, :t, :t)"),
                             {"j": job_id, "t": T0 + timedelta(hours=1)})
                raise RuntimeError("rolled back")
        assert [row["scheduled_for"] for row in runs(engine)] == [T0]
    finally:
        engine.dispose()
    autocommitting = create_engine(driver_url(database_url), pool_size=1, max_overflow=0, isolation_level="AUTOCOMMIT")
    try:
        assert isinstance(enqueue_scheduled(autocommitting, job_id, T0 + timedelta(hours=2)), Enqueued)
        with autocommitting.connect() as conn:
            conn.execute(text("INSERT INTO job_queue (job_id, scheduled_for, run_at) VALUES (:j, :t, :t)"),
                         {"j": job_id, "t": T0 + timedelta(hours=3)})
        assert len(runs(autocommitting)) == 3
    finally:
        autocommitting.dispose()


def test_sixteen_threads_enqueueing_one_fire_time_make_one_run(engine):
    job_id = register_job(engine, "report", schedule="0 * * * *")
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    engine.pool.dispose()
    warm = create_engine(engine.url, pool_size=16, max_overflow=0)
    connections = [warm.connect() for _ in range(16)]
    for conn in connections:  # warm: every thread starts on an open connection
        conn.execute(text("SELECT 1"))
        conn.commit()
    start = threading.Barrier(16)
    results = [None] * 16

    def racer(n):
        start.wait()
        results[n] = enqueue_scheduled(connections[n], job_id, T0)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for conn in connections:
        conn.close()
    warm.dispose()
    assert len(runs(engine)) == 1
    created = [r for r in results if isinstance(r, Enqueued)]
    assert len(created) == 1 and {r.run_id for r in results} == {created[0].run_id}


def _enqueue_many(url, job_id, barrier, results):
    engine = create_engine(driver_url(url), pool_size=1)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    fire_times = [T0 + timedelta(minutes=n) for n in range(1000)]
    barrier.wait()
    try:
        results.put(len(enqueue_scheduled_many(engine, [(job_id, t) for t in fire_times])))
    except Exception as error:  # reported to the parent, which fails the test
        results.put(repr(error))


def test_eight_processes_enqueueing_the_same_thousand_fire_times_make_a_thousand_runs(database_url, engine):
    job_id = register_job(engine, "report", schedule="* * * * *")
    outcomes = race_processes(_enqueue_many, (database_url, job_id))
    assert all(isinstance(o, int) for o in outcomes), outcomes
    assert sum(outcomes) == 1000
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*), count(DISTINCT scheduled_for) FROM job_queue")).one() == (1000, 1000)


def test_eight_processes_delivering_fire_times_a_cron_edit_cancelled_queue_each_again_once(database_url, engine):
    """The cron went from every minute to hourly and back: the 983 runs it cancelled are owed
    again, and producers racing to deliver them queue each once, without a deadlock."""
    job_id = register_job(engine, "report", schedule="* * * * *")
    assert len(enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(1000)])) == 1000
    register_job(engine, "report", schedule="0 * * * *")
    register_job(engine, "report", schedule="* * * * *")
    outcomes = race_processes(_enqueue_many, (database_url, job_id))
    assert all(isinstance(o, int) for o in outcomes), outcomes
    assert sum(outcomes) == 1000 - 17
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state, count(*), max(id) FROM job_queue GROUP BY state")).all() == [
            ("queued", 1000, 1000)]


WINDOW = 400


def _enqueue_a_window(url, job_id, barrier, results):
    """A producer offering 400 minutes from its own start: new fire times, then ones a cron
    edit cancelled, so its first statement both inserts and queues again, and where its
    first 100 end differs from the others'."""
    engine = create_engine(driver_url(url), pool_size=1)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    start = random.Random(os.getpid()).randrange(350, 500)
    fire_times = [T0 + timedelta(minutes=n) for n in range(start, start + WINDOW)]
    barrier.wait()
    try:
        results.put((start, enqueue_scheduled_many(engine, [(job_id, t) for t in fire_times])))
    except Exception as error:  # reported to the parent, which fails the test
        results.put(repr(error))


def test_producers_offering_different_windows_queue_again_and_insert_without_a_deadlock(database_url, engine):
    """Minutes 500-999 were queued, and a cron edit undone cancelled all but the hours'.
    Producers racing over different windows insert runs before 500 and queue those after
    again: each run is locked in one order whichever producer writes it, so none waits
    for another that waits for it."""
    job_id = register_job(engine, "report", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(500, 1000)])
    register_job(engine, "report", schedule="0 * * * *")
    register_job(engine, "report", schedule="* * * * *")
    outcomes = race_processes(_enqueue_a_window, (database_url, job_id))
    assert all(isinstance(o, tuple) for o in outcomes), outcomes
    offered = set().union(*(range(start, start + WINDOW) for start, _ in outcomes))
    hours = {n for n in range(500, 1000) if n % 60 == 0}
    assert sum(len(created) for _, created in outcomes) == len(offered - hours)
    with engine.connect() as conn:
        queued = conn.execute(text("SELECT scheduled_for FROM job_queue WHERE state = 'queued'")).scalars().all()
    assert sorted(queued) == sorted(T0 + timedelta(minutes=n) for n in offered | hours)


def test_whether_a_produce_has_runs_to_queue_again_is_answered_by_an_index_of_only_those(engine):
    """Every produce asks whether its jobs have a run their schedule cancelled, before its
    inserts; job_queue_unscheduled_idx holds only such runs, so the question costs the
    same however many runs the queue holds."""
    job_id = register_job(engine, "report", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(10_000)])
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE job_queue")
        cursor = conn.connection.driver_connection.cursor()
        (plan,) = cursor.execute("EXPLAIN (FORMAT JSON) " + QUEUE_QUERIES["any_unscheduled"], ([job_id],)).fetchone()
    scans = [(node["Node Type"], node.get("Index Name")) for node in plan_nodes(plan[0]["Plan"])
             if "Scan" in node["Node Type"]]
    assert scans == [("Index Only Scan", "job_queue_unscheduled_idx")], scans


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


@pytest.mark.parametrize("seed", range(4))
def test_asking_the_index_first_queues_what_restoring_every_time_queues_on_random_histories(engine, monkeypatch, seed):
    """The producers restore only when job_queue_unscheduled_idx says a job has a run its
    schedule cancelled. Two jobs live one random history of windows produced (single and
    many), cron edits away and back, and operator cancels; one asks the index first, the
    other restores every time, and their queues must end alike."""
    from rota.pipelines.queue import enqueue

    rng = random.Random(seed)
    steps = []
    for _ in range(40):
        kind = rng.choice(["window", "window", "single", "edit", "operator_cancel"])
        start = rng.randrange(0, 300)
        steps.append((kind, start, rng.randrange(1, 120), rng.choice(["0 * * * *", "*/15 * * * *", "* * * * *"])))

    def live(name, always_restore):
        monkeypatch.setattr(enqueue, "_ANY_UNSCHEDULED",
                            "SELECT %b::bigint[] IS NOT NULL" if always_restore else QUEUE_QUERIES["any_unscheduled"])
        job_id = register_job(engine, name, schedule="* * * * *")
        for kind, start, length, schedule in steps:
            if kind == "window":
                enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(start, start + length)])
            elif kind == "single":
                enqueue_scheduled(engine, job_id, T0 + timedelta(minutes=start))
            elif kind == "edit":
                register_job(engine, name, schedule=schedule)
            else:
                with engine.begin() as conn:
                    conn.execute(text("UPDATE job_queue SET state = 'cancelled', finished_at = now() "
                                      "WHERE job_id = :job AND scheduled_for = :at AND state = 'queued'"),
                                 {"job": job_id, "at": T0 + timedelta(minutes=start)})
        return [(r["scheduled_for"], r["state"], r["unscheduled_at"] is None)
                for r in runs(engine, f"job_id = {job_id}")]

    shortcut, full = live("asks_the_index", False), live("restores_always", True)
    assert shortcut == full
    assert any(state == "cancelled" for _, state, _ in full)


def test_event_runs_are_deduplicated_by_the_event_identity_and_do_not_touch_scheduled_ones(engine):
    report = register_job(engine, "report", schedule="0 * * * *", event_type="invoice.paid")
    mailer = register_job(engine, "mailer", event_type="invoice.paid")
    register_job(engine, "off", event_type="invoice.paid", enabled=False)
    register_job(engine, "other", event_type="invoice.void")
    a = enqueue_scheduled(engine, report, T0)
    b = enqueue_scheduled(engine, report, T0 + timedelta(hours=1))
    assert isinstance(a, Enqueued) and isinstance(b, Enqueued)
    event_id = add_event(engine, "invoice.paid", payload={"invoice": 7})
    assert dispatch_pending_events(engine) == (1, 2)
    before = database_fingerprint(engine)
    assert dispatch_pending_events(engine) == (0, 0)
    assert database_fingerprint(engine) == before
    with engine.begin() as conn:  # delivered again, as after a restore: the identity holds
        conn.execute(text("UPDATE event SET dispatched_at = NULL WHERE id = :e"), {"e": event_id})
    assert dispatch_pending_events(engine) == (1, 0)
    event_runs = runs(engine, "event_id IS NOT NULL")
    assert sorted(r["job_id"] for r in event_runs) == sorted([report, mailer])
    assert all(r["scheduled_for"] is None and r["payload"] == {"invoice": 7} for r in event_runs)
    assert len(runs(engine, "scheduled_for IS NOT NULL")) == 2


def test_a_workspace_job_hears_only_its_workspace_and_a_system_job_hears_all(engine):
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    scoped = register_job(engine, "scoped", event_type="ping", workspace_id=mine)
    system = register_job(engine, "system", event_type="ping")
    add_event(engine, "ping", mine)
    add_event(engine, "ping", theirs)
    dispatch_pending_events(engine)
    pairs = sorted((r["job_id"], r["workspace_id"]) for r in runs(engine))
    assert pairs == sorted([(scoped, mine), (system, mine), (system, theirs)])


def test_an_event_committed_long_after_its_id_was_taken_is_delivered(engine):
    """Delivery does not depend on how long the producing transaction stayed open: the
    event sensor's old cursor re-read ten minutes of ids and lost an event committed later."""
    register_job(engine, "mailer", event_type="ping")
    late = engine.connect()
    late.execute(insert(event), {"type": "ping"})  # id taken now, committed much later
    add_event(engine, "ping")
    assert dispatch_pending_events(engine) == (1, 1)
    for _ in range(3):  # however many passes go by, and however long they take
        assert dispatch_pending_events(engine) == (0, 0)
    late.commit()
    late.close()
    assert dispatch_pending_events(engine) == (1, 1)
    before = database_fingerprint(engine)
    assert dispatch_pending_events(engine) == (0, 0)
    assert database_fingerprint(engine) == before
    assert len(runs(engine)) == 2


def test_a_run_has_exactly_one_origin(engine):
    job_id = register_job(engine, "report")
    with pytest.raises(Exception, match="job_queue_one_origin"):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO job_queue (job_id) VALUES (:j)"), {"j": job_id})
    with pytest.raises(Exception, match="job_queue_one_origin"):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO job_queue (job_id, scheduled_for, source, source_ref) "
                              "VALUES (:j, now(), 'github', 'a/b#1')"), {"j": job_id})


def test_claim_leases_skips_locked_rows_and_cancels_runs_of_disabled_jobs(engine):
    job_id = register_job(engine, "report", schedule="* * * * *")
    off = register_job(engine, "off", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(5)] + [(off, T0)])
    enqueue_scheduled(engine, job_id, datetime.now(timezone.utc) + timedelta(hours=1))  # not due
    with engine.begin() as conn:  # an operator disables the job after its run was queued
        conn.execute(text("UPDATE job SET enabled = false WHERE id = :j"), {"j": off})
    with engine.connect() as holder:
        holder.execute(text("SELECT id FROM job_queue WHERE job_id = :j ORDER BY run_at LIMIT 1 FOR UPDATE"),
                       {"j": job_id})
        claimed = claim_due_runs(engine, "w1", 10, timedelta(seconds=30))
        holder.rollback()
    assert len(claimed) == 4 and all(r.attempts == 1 and r.job_name == "report" for r in claimed)
    assert runs(engine, f"job_id = {off}")[0]["state"] == "cancelled"
    assert "disabled" in runs(engine, f"job_id = {off}")[0]["last_error"]
    running = runs(engine, "state = 'running'")
    assert len(running) == 4 and {r["lease_owner"] for r in running} == {"w1"}
    assert complete(engine, claimed[0].id, "w2") is False
    assert complete(engine, claimed[0].id, "w1") is True


def test_a_worker_records_its_finished_runs_before_it_locks_any_to_claim(database_url, engine):
    """Another worker's claim may hold a lock on a run this worker finished (its FOR UPDATE
    SKIP LOCKED keeps a row it locked in passing whose recheck then failed). Waiting for
    that lock while holding the runs it is claiming would let the other wait in turn for
    those: each worker waiting for the other. Here a session holds the finished run; while
    the worker waits for it, the session must be able to lock every queued run."""
    job_id = register_job(engine, "report", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(11)])
    (finished,) = claim_due_runs(engine, "w", 1, timedelta(seconds=30))
    outcome = {}
    with psycopg.connect(libpq_url(database_url)) as other, \
            psycopg.connect(libpq_url(database_url), autocommit=True) as worker:
        other.execute("SELECT id FROM job_queue WHERE id = %s FOR UPDATE", (finished.id,))
        pid = worker.info.backend_pid

        def record_and_claim():
            try:
                outcome["result"] = complete_and_claim(worker, "w", [finished.id], 10, timedelta(seconds=30))
            except psycopg.Error as error:
                outcome["error"] = error

        call = threading.Thread(target=record_and_claim)
        call.start()
        wait_for(lambda: other.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                       (pid,)).fetchone()[0] == "Lock", 20, "the worker to wait for the finished run")
        other.execute("SET LOCAL lock_timeout = '10s'")
        queued = other.execute("SELECT id FROM job_queue WHERE state = 'queued' FOR UPDATE").fetchall()
        other.commit()
        call.join(timeout=30)
    assert len(queued) == 10 and "error" not in outcome, outcome
    recorded, claimed = outcome["result"]
    assert recorded == {finished.id} and len(claimed) == 10


def test_a_failed_attempt_backs_off_then_fails_for_good(engine):
    job_id = register_job(engine, "report", schedule="* * * * *", max_attempts=2)
    run_id = enqueue_scheduled(engine, job_id, T0).run_id
    (run,) = claim_due_runs(engine, "w1", 1, timedelta(seconds=30))
    delays = {"backoff": timedelta(seconds=60), "cap": timedelta(hours=1)}
    assert fail(engine, run.id, "w1", "first\x00 error", **delays) == "queued"
    (row,) = runs(engine)
    assert row["last_error"] == "first\\x00 error" and row["run_at"] > datetime.now(timezone.utc) + timedelta(seconds=50)
    assert claim_due_runs(engine, "w1", 1, timedelta(seconds=30)) == []
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET run_at = now() WHERE id = :id"), {"id": run_id})
    (run,) = claim_due_runs(engine, "w1", 1, timedelta(seconds=30))
    assert fail(engine, run.id, "w1", "second error", **delays) == "failed"
    (row,) = runs(engine)
    assert (row["state"], row["attempts"], row["last_error"]) == ("failed", 2, "second error")
    assert row["finished_at"] is not None and row["lease_owner"] is None


def test_an_expired_lease_is_reclaimed(engine):
    job_id = register_job(engine, "report", schedule="* * * * *", max_attempts=3)
    enqueue_scheduled(engine, job_id, T0)
    claim_due_runs(engine, "dead", 1, timedelta(seconds=0.01))
    time.sleep(0.05)
    assert reclaim_expired(engine) == {"queued": 1}
    (row,) = runs(engine)
    assert (row["state"], row["attempts"], row["lease_owner"]) == ("queued", 1, None)
    assert "lease of dead expired" in row["last_error"]
    assert complete(engine, row["id"], "dead") is False


def test_a_reclaimed_runs_error_names_when_its_lease_expired_in_utc(engine):
    """The suite's sessions run in America/St_Johns (tests/conftest.py): an error text
    outlives the session that wrote it, so the instant in it must not depend on that
    session's TimeZone."""
    job_id = register_job(engine, "report", schedule="* * * * *")
    enqueue_scheduled(engine, job_id, T0)
    claim_due_runs(engine, "dead", 1, timedelta(seconds=0.01))
    expired = runs(engine)[0]["lease_expires_at"].astimezone(timezone.utc)
    time.sleep(0.05)
    assert reclaim_expired(engine) == {"queued": 1}
    assert runs(engine)[0]["last_error"] == f"lease of dead expired at {expired:%Y-%m-%dT%H:%M:%S.%fZ} during attempt 1"


def test_enqueueing_never_touches_claim_or_lease_state(engine):
    job_id = register_job(engine, "report", schedule="* * * * *", event_type="ping")
    enqueue_scheduled(engine, job_id, T0)
    (claimed,) = claim_due_runs(engine, "w1", 1, timedelta(seconds=30))
    before = runs(engine)
    assert isinstance(enqueue_scheduled(engine, job_id, T0), AlreadyQueued)
    enqueue_scheduled_many(engine, [(job_id, T0)])
    add_event(engine, "ping")
    dispatch_pending_events(engine)
    assert runs(engine, f"id = {claimed.id}") == [before[0]]


# ------------------------------------------------------------------ worker processes

@pytest.fixture
def handler_calls(engine):
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))

    def calls(where="true"):
        with engine.connect() as conn:
            return conn.execute(text(f"SELECT run_id, attempt, job FROM handler_call WHERE {where} "
                                     "ORDER BY at")).all()
    return calls


def start_worker(database_url, *extra):
    env = {**os.environ, "ROTA_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([str(Path(sys.executable).parent / "rota"), "worker",
                             "--handlers", "tests.worker_handlers", "--poll", "0.05", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def stop(worker, timeout=30):
    worker.send_signal(signal.SIGTERM)
    output, _ = worker.communicate(timeout=timeout)
    return worker.returncode, output


def work_until(database_url, condition, what, *extra):
    """One worker runs until `condition` holds, then is stopped and must exit 0."""
    worker = start_worker(database_url, *extra)
    try:
        wait_for(condition, 60, what)
    finally:
        code, output = stop(worker)
    assert code == 0, output


def test_four_workers_drain_ten_thousand_runs_each_exactly_once(database_url, engine, handler_calls):
    job_id = register_job(engine, "count", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0 - timedelta(minutes=n)) for n in range(10_000)])
    workers = [start_worker(database_url) for _ in range(4)]
    try:
        wait_for(lambda: not runs(engine, "state <> 'succeeded'"), 240, "the queue to drain")
    finally:
        outcomes = [stop(w) for w in workers]
    assert [code for code, _ in outcomes] == [0, 0, 0, 0], outcomes
    with engine.connect() as conn:
        calls, distinct, attempts = conn.execute(text(
            "SELECT count(*), count(DISTINCT run_id), max(attempt) FROM handler_call")).one()
        states = conn.execute(text("SELECT state, count(*) FROM job_queue GROUP BY state")).all()
    assert (calls, distinct, attempts) == (10_000, 10_000, 1)
    assert states == [("succeeded", 10_000)]


def test_a_killed_workers_run_is_reclaimed_and_completed_by_another(database_url, engine, handler_calls):
    job_id = register_job(engine, "sleep", schedule="* * * * *")
    run_id = enqueue_scheduled(engine, job_id, T0).run_id
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET payload = '{\"seconds\": 3}' WHERE id = :id"), {"id": run_id})
    doomed = start_worker(database_url, "--lease", "2")
    wait_for(lambda: handler_calls(), 60, "the first attempt to start")
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=30)
    assert runs(engine)[0]["state"] == "running"
    work_until(database_url, lambda: runs(engine)[0]["state"] == "succeeded", "the rescue", "--lease", "2")
    (row,) = runs(engine)
    assert row["attempts"] == 2 and "expired" in row["last_error"]
    assert [c[1] for c in handler_calls()] == [1, 2]


def test_sigterm_finishes_the_run_in_progress_and_exits_zero(database_url, engine, handler_calls):
    job_id = register_job(engine, "sleep", schedule="* * * * *")
    enqueue_scheduled_many(engine, [(job_id, T0 + timedelta(minutes=n)) for n in range(5)])
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET payload = '{\"seconds\": 1}'"))
    worker = start_worker(database_url, "--grace", "10")
    wait_for(lambda: handler_calls(), 60, "a run to start")
    started = time.monotonic()
    code, output = stop(worker)
    assert code == 0 and time.monotonic() - started < 10, output
    states = sorted(r["state"] for r in runs(engine))
    assert "running" not in states and states.count("succeeded") == 1, states
    assert all(r["attempts"] == 0 for r in runs(engine, "state = 'queued'"))


def test_sigterm_past_the_grace_period_hands_the_run_on_only_after_the_worker_is_gone(
        database_url, engine, handler_calls):
    """The run in hand is never executed by two workers at once: past the grace period the
    worker shortens its lease and exits, and the run is reclaimed only after that."""
    job_id = register_job(engine, "sleep", schedule="* * * * *")
    enqueue_scheduled(engine, job_id, T0)
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET payload = '{\"seconds\": 60}'"))
    worker = start_worker(database_url, "--grace", "1")
    wait_for(lambda: handler_calls(), 60, "the run to start")
    rescuer = start_worker(database_url, "--lease", "30")
    try:
        code, output = stop(worker, timeout=15)
        with engine.connect() as conn:
            gone = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        assert code == 0, output
        wait_for(lambda: len(handler_calls()) == 2, 30, "another worker to take the run on")
    finally:
        stop(rescuer)
    (row,) = runs(engine)
    assert row["attempts"] == 2 and "grace period" in row["last_error"]
    with engine.connect() as conn:
        second = conn.execute(text("SELECT max(at) FROM handler_call")).scalar_one()
    assert second > gone, (second, gone)


def test_a_raising_handler_is_retried_with_backoff_then_failed_with_its_error(database_url, engine, handler_calls):
    job_id = register_job(engine, "boom", schedule="* * * * *", max_attempts=3)
    enqueue_scheduled(engine, job_id, T0)
    work_until(database_url, lambda: runs(engine)[0]["state"] == "failed", "the run to fail for good",
               "--backoff", "0.2")
    (row,) = runs(engine)
    assert row["attempts"] == 3 and "boom on attempt 3" in row["last_error"] and "DROP TABLE job;" in row["last_error"]
    assert [attempt for _, attempt, _ in handler_calls()] == [1, 2, 3]
    with engine.connect() as conn:
        gaps = conn.execute(text("SELECT extract(epoch FROM at - lag(at) OVER (ORDER BY at)) FROM handler_call")).scalars().all()[1:]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps  # 0.2 s, then 0.4 s


def test_a_tenant_never_sees_system_runs_or_another_workspace(database_url, engine):
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    system = register_job(engine, "system", schedule="* * * * *")
    scoped = register_job(engine, "scoped", schedule="* * * * *", workspace_id=mine)
    other = register_job(engine, "other", schedule="* * * * *", workspace_id=theirs)
    for job_id in (system, scoped, other):
        enqueue_scheduled(engine, job_id, T0)
    add_event(engine, "ping", mine)
    add_event(engine, "ping", None)
    with tenant(database_url, mine) as conn:
        assert conn.execute("SELECT job_id FROM job_queue").fetchall() == [(scoped,)]
        assert conn.execute("SELECT count(*) FROM event").fetchone() == (1,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table job_queue"):
            conn.execute("UPDATE job_queue SET state = 'cancelled' WHERE workspace_id IS NULL")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO event (workspace_id, type) VALUES (NULL, 'forged')")
        assert conn.execute("SELECT id FROM job").fetchall() == [(scoped,)]
        conn.execute("RESET rota.workspace_id")
        assert conn.execute("SELECT count(*) FROM job_queue").fetchone() == (0,)
    assert {r["state"] for r in runs(engine)} == {"queued"}
