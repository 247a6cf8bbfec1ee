"""Everything at once (issue 6, case 4): eight dispatch runs, four cron schedulers, two
event sensors and four workers against one database, as separate processes. Every
identity holds, no deadlock surfaces as a failure, every run executes exactly once."""

import multiprocessing
import random
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, text

from benchmarks.data import load_duties
from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.periods.calendar import open_range, periods_between
from rota.pipelines.queue.assets import _SCHEDULED_JOBS
from rota.pipelines.queue.enqueue import enqueue_scheduled_many
from rota.pipelines.queue.events import dispatch_pending_events
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.scheduling import ScheduledJob, plan_fire_times
from rota.resources.database.schema import FREQUENCIES
from rota.resources.database.server import driver_url
from tests.queue.test_queue import start_worker, stop, wait_for

RACE_SECONDS = 20
TICKS = [datetime(2026, 11, 28, tzinfo=timezone.utc) + timedelta(hours=n) for n in range(0, 24 * 5, 7)]


def _dispatcher(url, seed, results):
    """Every tick and frequency, round after round; two of the eight run backfills."""
    engine = create_engine(driver_url(url))
    rng, deadlocks, rounds = random.Random(seed), 0, 0
    mode = Mode.BACKFILL if seed < 2 else Mode.SCHEDULED
    try:
        deadline = time.monotonic() + RACE_SECONDS
        while time.monotonic() < deadline:
            for tick, frequency in rng.sample([(t, f) for t in TICKS for f in FREQUENCIES], len(TICKS) * 5):
                first, last = open_range(frequency, tick, 40)
                report = dispatch(engine, frequency=frequency, mode=mode, as_of=tick,
                                  requested=periods_between(first, last), page_size=rng.choice([300, 1000, 5000]))
                if report.unplannable:
                    raise AssertionError(f"unplannable {report.unplannable}")
                if report.marks_deferred:  # no tenant holds anything here: only other runs' pages
                    raise AssertionError(f"marks deferred {sorted(report.marks_deferred)}")
                deadlocks += report.deadlocks_retried
            rounds += 1
        results.put(("dispatcher", "ok", deadlocks, rounds))
    except Exception as error:  # noqa: BLE001 - reported to the test
        results.put(("dispatcher", f"{type(error).__name__}: {error}", deadlocks, rounds))


def _cron_scheduler(url, seed, hours, results):
    engine = create_engine(driver_url(url))
    rng, rounds = random.Random(seed), 0
    try:
        deadline = time.monotonic() + RACE_SECONDS
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                jobs = [ScheduledJob(*row) for row in conn.execute(_SCHEDULED_JOBS)]
            for hour in rng.sample(hours, len(hours)):
                due = plan_fire_times(jobs, hour, hour + timedelta(hours=1), as_of=hour, catch_up=None).due
                enqueue_scheduled_many(engine, due)
            rounds += 1
        results.put(("scheduler", "ok", 0, rounds))
    except Exception as error:  # noqa: BLE001 - reported to the test
        results.put(("scheduler", f"{type(error).__name__}: {error}", 0, rounds))


def _event_sensor(url, results):
    engine = create_engine(driver_url(url))
    rounds = 0
    try:
        deadline = time.monotonic() + RACE_SECONDS + 2  # a last pass after the producer stops
        while time.monotonic() < deadline:
            dispatch_pending_events(engine)
            rounds += 1
            time.sleep(0.05)
        results.put(("sensor", "ok", 0, rounds))
    except Exception as error:  # noqa: BLE001 - reported to the test
        results.put(("sensor", f"{type(error).__name__}: {error}", 0, rounds))


@pytest.mark.slow
def test_dispatchers_schedulers_sensors_and_workers_all_at_once(database_url, engine):
    load_duties(engine, 3000)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE handler_call (run_id bigint, attempt int, job text, "
                          "at timestamptz DEFAULT clock_timestamp())"))
    register_job(engine, "count", schedule="*/5 * * * *", timezone="Asia/Kathmandu")
    register_job(engine, "count-events", event_type="ping")
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    hours = [now - timedelta(hours=n) for n in range(1, 7)]

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_dispatcher, args=(database_url, n, results)) for n in range(8)]
    processes += [context.Process(target=_cron_scheduler, args=(database_url, n, hours, results)) for n in range(4)]
    processes += [context.Process(target=_event_sensor, args=(database_url, results)) for _ in range(2)]
    workers = [start_worker(database_url) for _ in range(4)]
    for process in processes:
        process.start()
    events = 0
    try:
        deadline = time.monotonic() + RACE_SECONDS
        while time.monotonic() < deadline:  # the application writing events meanwhile
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO event (type) SELECT 'ping' FROM generate_series(1, 5)"))
            events += 5
            time.sleep(0.1)
        outcomes = [results.get(timeout=300) for _ in processes]
        for process in processes:
            process.join(timeout=30)
        expected_runs = events + 6 * 12
        wait_for(lambda: _count(engine, "SELECT count(*) FROM job_queue WHERE state = 'succeeded'") == expected_runs,
                 180, "every run to finish")
    finally:
        stopped = [stop(worker) for worker in workers]
    assert [o for o in outcomes if o[1] != "ok"] == []
    assert all(rounds > 0 for *_, rounds in outcomes), outcomes
    assert [code for code, _ in stopped] == [0, 0, 0, 0], stopped

    # Every identity holds: one task per (duty, period), one run per fire time and per
    # (event, job); and a last dispatch over the same ticks finds nothing left to do.
    assert _count(engine, "SELECT count(*) - count(DISTINCT (duty_id, period_key)) FROM task") == 0
    assert _count(engine, "SELECT count(*) FROM job_queue WHERE scheduled_for IS NOT NULL") == 6 * 12
    assert _count(engine, "SELECT count(*) FROM job_queue WHERE event_id IS NOT NULL") == events
    assert _count(engine, "SELECT count(*) FROM job_queue") == expected_runs
    for tick in TICKS:
        for frequency in FREQUENCIES:
            first, last = open_range(frequency, tick, 40)
            report = dispatch(engine, frequency=frequency, mode=Mode.BACKFILL, as_of=tick,
                              requested=periods_between(first, last))
            assert report.total("created") == 0, (tick, frequency)
    assert _count(engine, "SELECT count(*) FROM duty d WHERE d.last_dispatched_period IS DISTINCT FROM "
                          "(SELECT max(period_key) FROM task t WHERE t.duty_id = d.id)") == 0
    # Every run executed exactly once.
    assert _count(engine, "SELECT count(*) FROM handler_call") == expected_runs
    assert _count(engine, "SELECT count(DISTINCT run_id) FROM handler_call") == expected_runs
    assert _count(engine, "SELECT max(attempts) FROM job_queue") == 1


def _count(engine, query: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text(query)).scalar_one()
