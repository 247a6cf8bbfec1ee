"""The dispatcher against a real PostgreSQL: idempotence, races, paging, the
never-touch-a-task guarantee and last_dispatched_period."""

import gc
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta

import psycopg
import pytest
from psycopg.adapt import PyFormat
from psycopg.pq import Format
from sqlalchemy import create_engine, text, update

from rota.pipelines.dispatch import run as dispatch_run
from rota.pipelines.dispatch import writing
from rota.pipelines.dispatch.planner import Mode, plan
from rota.pipelines.dispatch.reading import read_pages
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.dispatch.writing import ensure_partitions, write_plan
from rota.pipelines.periods.calendar import (
    local_date,
    open_range,
    parse_instant,
    period_containing,
    periods_between,
)
from rota.resources.database.schema import MAX_LEAD_DAYS, duty, task
from rota.resources.database.server import driver_url, libpq_url
from tests.helpers import (
    gaps_after,
    add_duty,
    database_fingerprint,
    delete_duty_with_its_tasks,
    duty_values,
    insert_duties,
    keys_by_duty,
    last_dispatched,
    race_processes,
    record_outcome,
    run_while_held,
    task_keys,
    wait_until_blocked_by,
)

ZONES = ["UTC", "Asia/Shanghai", "America/Los_Angeles", "Pacific/Kiritimati", "Pacific/Pago_Pago",
         "Asia/Kathmandu", "Pacific/Chatham", "Europe/London", "America/New_York", "Australia/Lord_Howe"]


def months(first: str, last: str):
    return periods_between(period_containing("monthly", date.fromisoformat(first + "-01")),
                           period_containing("monthly", date.fromisoformat(last + "-01")))


def run(engine, as_of, requested, frequency="monthly", mode=Mode.SCHEDULED, page_size=10_000):
    report = dispatch(engine, frequency=frequency, mode=mode, as_of=parse_instant(as_of),
                      requested=requested, page_size=page_size)
    assert not report.unplannable and not gaps_after(engine, report).count
    return report


def many_duties(engine, count=200, frequency="monthly"):
    rows = [duty_values(timezone=ZONES[i % len(ZONES)], lead_days=(i * 7) % 40, frequency=frequency,
                        title=f"duty {i}") for i in range(count)]
    return insert_duties(engine, rows)


def test_a_second_identical_run_writes_nothing_at_all(engine):
    many_duties(engine)
    add_duty(engine, kind="standing")
    add_duty(engine, state="paused")
    requested = months("2026-07", "2026-11")
    first = run(engine, "2026-08-31T20:00:00Z", requested)
    assert first.total("created") > 200
    before = database_fingerprint(engine)
    second = run(engine, "2026-08-31T20:00:00Z", requested)
    assert second.total("created") == 0 and second.duties_read == 0  # nothing left to read
    assert database_fingerprint(engine) == before


def test_pages_written_at_once_make_exactly_what_one_writer_makes(engine):
    """Several pages in flight, each on its own connection: the same tasks, marks and
    counts as one page at a time."""
    for frequency in ("daily", "monthly"):
        many_duties(engine, count=300, frequency=frequency)
    tick = parse_instant("2026-08-31T20:00:00Z")
    outcomes = []
    for writers in (1, 4):
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE task"))
            conn.execute(text("UPDATE duty SET last_dispatched_period = NULL"))
        reports = [dispatch(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=tick,
                            requested=periods_between(*open_range(frequency, tick, MAX_LEAD_DAYS)),
                            page_size=17, writers=writers)
                   for frequency in ("daily", "monthly")]
        with engine.connect() as conn:
            tasks = conn.execute(text(
                "SELECT duty_id, period_key, workspace_id, period_start, due_date, visible_from "
                "FROM task ORDER BY duty_id, period_key")).all()
            marks = conn.execute(text("SELECT id, last_dispatched_period FROM duty ORDER BY id")).all()
        outcomes.append((tasks, marks, [(r.pages, r.duties_read, r.counts) for r in reports]))
    assert len(outcomes[0][0]) > 600 and outcomes[0][2][0][0] > 4
    assert outcomes[1] == outcomes[0]


def test_the_fingerprint_sees_an_update_to_the_same_value(engine):
    duty_id = add_duty(engine)
    before = database_fingerprint(engine)
    with engine.begin() as conn:
        conn.execute(update(duty).where(duty.c.id == duty_id).values(title="Water the plants"))
    assert database_fingerprint(engine) != before


def test_a_conflicting_insert_would_consume_an_identity_value(engine):
    """The reason rows that exist are filtered inside the INSERT: ON CONFLICT alone burns ids."""
    duty_id = add_duty(engine)
    run(engine, "2026-08-31T12:00:00Z", months("2026-08", "2026-08"))
    before = database_fingerprint(engine)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from) "
            "SELECT id, workspace_id, '2026-08', '2026-08-01', '2026-08-31', '2026-08-31' FROM duty "
            "WHERE id = :id ON CONFLICT ON CONSTRAINT task_dispatch_identity DO NOTHING"), {"id": duty_id})
    assert database_fingerprint(engine) != before


def test_shanghai_and_los_angeles_in_one_run(engine):
    shanghai = add_duty(engine, timezone="Asia/Shanghai")
    los_angeles = add_duty(engine, timezone="America/Los_Angeles")
    report = run(engine, "2026-08-31T20:00:00Z", months("2026-08", "2026-09"))
    assert keys_by_duty(engine) == {shanghai: ["2026-09"], los_angeles: ["2026-08"]}
    # Los Angeles is still in August: September was asked for and lies beyond its reach.
    assert report.by_timezone() == {"America/Los_Angeles": {"created": 1, "skipped": 1},
                                    "Asia/Shanghai": {"created": 1}}
    assert report.for_period("2026-09") == {"created": 1, "existing": 0, "held": 0, "skipped": 1, "outside_window": 0}


def test_standing_and_paused_produce_nothing_and_unpausing_skips_the_gap(engine):
    add_duty(engine, kind="standing")
    paused = add_duty(engine, state="paused")
    requested = months("2026-01", "2026-12")
    run(engine, "2026-03-15T12:00:00Z", requested)
    run(engine, "2026-03-15T12:00:00Z", requested, mode=Mode.BACKFILL)
    assert task_keys(engine) == []
    with engine.begin() as conn:
        conn.execute(update(duty).where(duty.c.id == paused).values(state="active"))
    run(engine, "2026-07-15T12:00:00Z", requested)
    assert task_keys(engine, paused) == ["2026-07"]


def test_last_dispatched_period_advances_and_never_regresses(engine):
    duty_id = add_duty(engine)
    requested = months("2025-01", "2026-12")
    run(engine, "2026-05-10T12:00:00Z", requested)
    assert last_dispatched(engine, duty_id) == "2026-05"
    run(engine, "2026-06-10T12:00:00Z", requested)
    assert last_dispatched(engine, duty_id) == "2026-06"
    run(engine, "2026-06-10T12:00:00Z", months("2025-01", "2025-12"), mode=Mode.BACKFILL)
    assert len(task_keys(engine, duty_id)) == 14
    assert last_dispatched(engine, duty_id) == "2026-06"
    run(engine, "2026-03-10T12:00:00Z", requested)  # an old tick re-run late
    assert last_dispatched(engine, duty_id) == "2026-06"


def test_last_dispatched_period_is_always_the_newest_task(engine):
    many_duties(engine, 60)
    run(engine, "2026-08-20T12:00:00Z", months("2026-01", "2026-12"), mode=Mode.BACKFILL)
    run(engine, "2026-08-31T20:00:00Z", months("2026-08", "2026-10"))
    with engine.connect() as conn:
        wrong = conn.execute(text(
            "SELECT d.id FROM duty d JOIN task t ON t.duty_id = d.id GROUP BY d.id "
            "HAVING d.last_dispatched_period IS DISTINCT FROM max(t.period_key)")).all()
    assert wrong == []


def test_marks_another_run_holds_move_once_it_lets_go(engine, monkeypatch):
    """Two runs over the same duties at once, as the races test runs them: a backfill of an
    older month whose page holds its duties' rows (its marks moved, its COPY not yet
    committed), and the scheduled run of the current month, which does not wait on those
    rows and writes its tasks around them (insert_careful, marks deferred). Once the
    backfill commits, the older marks it wrote must not stay: every mark ends at its duty's
    newest task (SPEC §2), and none is reported deferred, since no tenant held anything."""
    ids = many_duties(engine, 40)
    ensure_partitions(engine, ["2026-07", "2026-08", "2026-09", "2026-10"])
    copy_tasks, move_marks = writing._copy_tasks, dispatch_run.move_deferred_marks
    holding, moving = threading.Event(), threading.Event()

    def copy_when_the_other_run_moves_marks(cursor, page_plan, advanced):
        if any(period[0] == "2026-07" for _, period in page_plan.tasks()):
            holding.set()
            assert moving.wait(30)
            time.sleep(0.5)  # the other run's first try meets this page's row locks
        return copy_tasks(cursor, page_plan, advanced)

    def moving_marks(*args):
        moving.set()
        return move_marks(*args)

    monkeypatch.setattr(writing, "_copy_tasks", copy_when_the_other_run_moves_marks)
    monkeypatch.setattr(dispatch_run, "move_deferred_marks", moving_marks)
    with ThreadPoolExecutor(max_workers=1) as pool:
        backfill = pool.submit(run, engine, "2026-08-20T12:00:00Z", months("2026-07", "2026-07"), mode=Mode.BACKFILL)
        assert holding.wait(30)
        scheduled = run(engine, "2026-08-20T12:00:00Z", months("2026-08", "2026-09"))
        assert backfill.result(timeout=30).total("created") == len(ids)
    assert scheduled.pages_written_again == 1 and scheduled.total("created") >= len(ids)
    assert scheduled.marks_deferred == set()
    with engine.connect() as conn:
        wrong = conn.execute(text(
            "SELECT d.id, d.last_dispatched_period, max(t.period_key) FROM duty d JOIN task t ON t.duty_id = d.id "
            "GROUP BY d.id HAVING d.last_dispatched_period IS DISTINCT FROM max(t.period_key)")).all()
    assert wrong == []


def test_a_page_that_never_lets_go_costs_the_run_marks_wait_at_most(database_url, engine, monkeypatch):
    """The wait for another run's page is bounded: a transaction that holds a duty row and
    dispatch_page_lock as a page does, and never ends, leaves that duty's mark deferred
    and reported after MARKS_WAIT, its task made."""
    ids = many_duties(engine, 40)
    ensure_partitions(engine, ["2026-08", "2026-09", "2026-10"])
    monkeypatch.setattr(writing, "MARKS_WAIT", 1.0)
    page = psycopg.connect(libpq_url(database_url))
    page.execute("SELECT 1 FROM dispatch_page_lock WHERE frequency = 'monthly' FOR KEY SHARE")
    page.execute("SELECT 1 FROM duty WHERE id = %s FOR NO KEY UPDATE", (ids[5],))

    try:
        report = run_while_held(page, lambda: run(engine, "2026-08-20T12:00:00Z", months("2026-08", "2026-09")), 20)
    finally:
        page.close()

    assert report.marks_deferred == {ids[5]}
    assert set(keys_by_duty(engine)) == set(ids)
    assert last_dispatched(engine, ids[5]) is None


def test_a_run_moving_marks_while_pages_are_written_holds_the_page_lock_as_a_page(database_url, engine):
    """A run that moves deferred marks while pages of its frequency are written locks
    duty rows as a page does: another run, finding no page in flight, must not take
    those rows for a tenant's."""
    page = psycopg.connect(libpq_url(database_url))
    page.execute("SELECT 1 FROM dispatch_page_lock WHERE frequency = 'monthly' FOR KEY SHARE")
    with engine.begin() as mover, engine.begin() as other:
        assert writing._pages_paused(mover.connection.driver_connection.cursor(), "monthly") is False
        page.close()
        assert writing._pages_paused(other.connection.driver_connection.cursor(), "monthly") is False
        assert writing._pages_paused(other.connection.driver_connection.cursor(), "weekly") is True


def test_a_page_lock_gone_fails_the_run_naming_it(engine):
    many_duties(engine, 5)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM dispatch_page_lock WHERE frequency = 'monthly'"))
    with pytest.raises(RuntimeError, match="dispatch_page_lock has no row for 'monthly'.*rota migrate"):
        run(engine, "2026-08-20T12:00:00Z", months("2026-08", "2026-08"))
    assert keys_by_duty(engine) == {}


def test_a_page_smaller_than_the_duties_still_covers_every_duty(engine):
    ids = many_duties(engine, 57)
    report = run(engine, "2026-08-31T20:00:00Z", months("2026-08", "2026-09"), page_size=10)
    assert report.pages == 6 and report.duties_read == 57
    assert set(keys_by_duty(engine)) == set(ids)


def test_the_dispatcher_never_updates_or_deletes_a_task(engine):
    """Guards the stagnation clock: existing task rows keep their row versions."""
    many_duties(engine, 80)
    run(engine, "2026-07-10T12:00:00Z", months("2026-01", "2026-12"), mode=Mode.BACKFILL)
    with engine.begin() as conn:
        conn.execute(update(task).where(task.c.period_key == "2026-05").values(status="done"))
    with engine.connect() as conn:
        before = conn.execute(text("SELECT id, ctid::text, xmin::text, updated_at FROM task ORDER BY id")).all()
    run(engine, "2026-08-31T20:00:00Z", months("2026-01", "2026-12"), mode=Mode.BACKFILL)
    run(engine, "2026-08-31T20:00:00Z", months("2026-07", "2026-10"))
    with engine.connect() as conn:
        after = conn.execute(text("SELECT id, ctid::text, xmin::text, updated_at FROM task ORDER BY id")).all()
    assert len(after) > len(before)
    assert after[: len(before)] == before


def test_the_dispatcher_never_touches_a_task_a_racing_writer_just_made(engine, caplog):
    """The conflict path itself: the row is invisible to the dispatcher's snapshot, so its
    plain insert waits on the unique index, and meets task_dispatch_identity or gives up
    waiting (the fast path's lock_timeout); either way the page is written again with ON
    CONFLICT DO NOTHING, which waits for the racer; the caller sees no error."""
    caplog.set_level(logging.INFO, logger="rota.pipelines.dispatch")
    duty_id = add_duty(engine)
    ensure_partitions(engine, ["2026-08"])
    outcome = {}
    with engine.connect() as racer:
        racer.execute(text(
            "INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from, "
            "status, updated_at) SELECT id, workspace_id, '2026-08', '2026-08-01', '2026-08-31', "
            "'2026-08-31', 'done', '2026-08-02T09:00:00Z' FROM duty WHERE id = :id"), {"id": duty_id})

        def dispatcher():
            try:
                outcome["report"] = run(engine, "2026-08-20T12:00:00Z", months("2026-08", "2026-08"))
            except Exception as error:  # re-raised in the test thread below
                outcome["error"] = error

        thread = threading.Thread(target=dispatcher)
        thread.start()
        wait_until_blocked_by(engine, racer, "the dispatcher's insert")
        written = racer.execute(text("SELECT xmin::text, updated_at FROM task")).one()
        racer.commit()
        thread.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["report"].total("existing") == 1 and outcome["report"].total("created") == 0
    assert "writing the page again" in caplog.text
    with engine.connect() as conn:
        assert conn.execute(text("SELECT xmin::text, updated_at FROM task")).one() == written
        assert conn.execute(text("SELECT status FROM task")).scalar_one() == "done"


def test_a_task_past_the_mark_sends_the_copied_page_around_it(engine, caplog):
    """A page whose tasks all lie past their duties' last_dispatched_period is COPYed; a
    task already there (made behind the dispatcher's back, committed) makes the COPY fail
    on task_dispatch_identity, and the page is written again around it: the others are
    made, the task is left as it was, and the report counts it as existing."""
    caplog.set_level(logging.INFO, logger="rota.pipelines.dispatch")
    ids = many_duties(engine, count=30)
    ensure_partitions(engine, ["2026-08"])
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from, status) "
            "SELECT id, workspace_id, '2026-08', '2026-08-01', '2026-08-31', '2026-08-31', 'done' "
            "FROM duty WHERE id = :id"), {"id": ids[11]})
        made = conn.execute(text("SELECT xmin::text FROM task")).scalar_one()
    report = run(engine, "2026-08-20T12:00:00Z", months("2026-08", "2026-08"))
    assert (report.pages_copied, report.pages_written_again) == (0, 1)
    assert report.for_period("2026-08") == {"created": 29, "existing": 1, "held": 0, "skipped": 0, "outside_window": 0}
    assert "writing the page again" in caplog.text
    with engine.connect() as conn:
        assert conn.execute(text("SELECT xmin::text, status FROM task WHERE duty_id = :d"),
                            {"d": ids[11]}).one() == (made, "done")
    assert {duty_id: keys for duty_id, keys in keys_by_duty(engine).items()} == {d: ["2026-08"] for d in ids}
    # The next month's page lies past every mark again, and is COPYed.
    assert run(engine, "2026-09-20T12:00:00Z", months("2026-09", "2026-09")).pages_copied == 1


def test_a_thirteen_month_backfill_makes_exactly_the_expected_keys(engine):
    plain = add_duty(engine, timezone="Pacific/Chatham")
    closed = add_duty(engine, effective_from=date(2025, 1, 1), effective_to=date(2025, 12, 31))
    late = add_duty(engine, effective_from=date(2026, 3, 10))
    ahead = add_duty(engine, lead_days=40)
    requested = months("2025-08", "2026-10")  # 15 periods, 2026-09 and -10 beyond the horizon
    first = run(engine, "2026-08-25T12:00:00Z", requested, mode=Mode.BACKFILL)
    thirteen = [p.key for p in months("2025-08", "2026-08")]
    assert keys_by_duty(engine) == {
        plain: thirteen,
        closed: [p.key for p in months("2025-08", "2025-12")],
        late: [p.key for p in months("2026-03", "2026-08")],
        ahead: thirteen + ["2026-09"],
    }
    assert first.total("skipped") == 2 + 2 + 2 + 1
    before = database_fingerprint(engine)
    second = run(engine, "2026-08-25T12:00:00Z", requested, mode=Mode.BACKFILL)
    assert second.total("created") == 0 and database_fingerprint(engine) == before


def _racer(url, as_of, first, last, barrier, results):
    from rota.pipelines.dispatch.run import dispatch as dispatch_in_child

    engine = create_engine(driver_url(url), pool_size=1)
    with engine.connect() as conn:  # warm the pool before the start line
        conn.execute(text("SELECT 1"))
    requested = months(first, last)
    barrier.wait()
    try:
        report = dispatch_in_child(engine, frequency="monthly", mode=Mode.BACKFILL,
                                   as_of=parse_instant(as_of), requested=requested, page_size=100)
        results.put(("ok", report.total("created"), report.deadlocks_retried))
    except Exception as error:  # reported to the parent, which fails the test
        results.put(("error", repr(error), 0))


def test_eight_concurrent_runs_of_the_same_partitions_make_one_task_each(database_url, engine):
    ids = many_duties(engine, 400)
    outcomes = race_processes(_racer, (database_url, "2026-08-31T20:00:00Z", "2025-08", "2026-09"))
    assert [o for o in outcomes if o[0] != "ok"] == []
    with engine.connect() as conn:
        rows, distinct = conn.execute(text(
            "SELECT count(*), count(DISTINCT (duty_id, period_key)) FROM task")).one()
    assert rows == distinct and sum(o[1] for o in outcomes) == rows
    assert set(keys_by_duty(engine)) == set(ids)


def test_a_duty_deleted_while_its_tasks_are_being_written_leaves_no_orphan(database_url, engine):
    """The dispatcher holds its duties FOR KEY SHARE: a delete that was in flight when the
    page was read either goes first (the duty then offers nothing) or waits and fails."""
    ids = many_duties(engine, count=50)
    victim = ids[17]
    deleter = create_engine(driver_url(database_url))
    conn = deleter.connect()
    conn.execute(text("DELETE FROM duty WHERE id = :d"), {"d": victim})  # uncommitted until below
    result = {}
    writer = threading.Thread(target=lambda: result.update(report=run(engine, "2026-08-31T20:00:00Z",
                                                                      months("2026-07", "2026-11"))))
    writer.start()
    wait_until_blocked_by(engine, conn, "the writer's lock on its page of duties")
    conn.commit()
    writer.join(timeout=60)
    conn.close()
    deleter.dispose()
    assert result["report"].duties_read == 50
    with engine.connect() as check:
        orphans = check.execute(text(
            "SELECT count(*) FROM task t WHERE NOT EXISTS (SELECT 1 FROM duty d WHERE d.id = t.duty_id)")).scalar_one()
        assert orphans == 0
        assert check.execute(text("SELECT count(DISTINCT duty_id) FROM task")).scalar_one() == 49


# The page's own lock_timeout (writing.py: a fast-path page gives up on a lock within
# 100 ms) must not cut the hold short: the page would be written again meanwhile, and the
# test would race the page it means to hold.
_HOLD_PAGES = (
    """CREATE FUNCTION test_hold_page() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN PERFORM set_config('lock_timeout', '0', true); PERFORM pg_advisory_xact_lock_shared(4242);
             RETURN NULL; END $$""",
    "CREATE TRIGGER zz_hold_page AFTER INSERT ON task FOR EACH STATEMENT EXECUTE FUNCTION test_hold_page()",
)


def _waiting_or_done(engine, query_prefix: str, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 20
    with engine.connect() as observer:
        while thread.is_alive() and not observer.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE :q AND cardinality(pg_blocking_pids(pid)) > 0"),
                {"q": query_prefix + "%"}).scalar_one():
            assert time.monotonic() < deadline, f"{query_prefix} neither waited nor finished"
            observer.rollback()
            time.sleep(0.05)


@pytest.mark.parametrize("advances", [True, False], ids=["duty-advances", "backfill-behind-the-duty"])
def test_a_deletion_after_a_pages_write_waits_for_the_page_and_fails(database_url, engine, advances):
    """The page holds its duties until it commits, whether or not it moves them: the
    statement trigger takes the page's word for them (migration 0012), so the page's own
    lock is all that keeps a deletion that comes after its write from leaving orphans."""
    victim = add_duty(engine)
    if not advances:  # the duty is already past the backfilled month, so the page only locks it
        run(engine, "2026-11-30T12:00:00Z", months("2026-11", "2026-11"), mode=Mode.BACKFILL)
    with engine.begin() as conn:
        for statement in _HOLD_PAGES:
            conn.execute(text(statement))
    holder = create_engine(driver_url(database_url))
    outcome, result = {}, {}
    with holder.connect() as hold:
        hold.execute(text("SELECT pg_advisory_lock(4242)"))
        writer = threading.Thread(target=lambda: result.update(report=dispatch(
            engine, frequency="monthly", mode=Mode.BACKFILL, as_of=parse_instant("2026-11-30T12:00:00Z"),
            requested=months("2026-08", "2026-08"))))
        writer.start()
        wait_until_blocked_by(engine, hold, "the page, after its write")
        deleter = threading.Thread(target=record_outcome,
                                   args=(lambda: delete_duty_with_its_tasks(engine, victim), outcome))
        deleter.start()
        _waiting_or_done(engine, "DELETE FROM duty", deleter)
        hold.execute(text("SELECT pg_advisory_unlock(4242)"))
        writer.join(timeout=60)
        deleter.join(timeout=60)
    holder.dispose()
    assert result["report"].total("created") == 1
    assert result["report"].pages_written_again == 0  # the page held was the page that wrote
    assert "still has tasks" in outcome.get("error", ""), outcome
    with engine.connect() as check:
        assert check.execute(text(
            "SELECT count(*) FROM task t WHERE NOT EXISTS (SELECT 1 FROM duty d WHERE d.id = t.duty_id)")).scalar_one() == 0
    assert "2026-08" in task_keys(engine, victim)


def test_the_scheduled_read_uses_the_planners_calendar_where_the_tz_databases_disagree(engine):
    """PostgreSQL's tz database and Python's are separate releases: at 2026-12-31T23:00Z
    this PostgreSQL puts Africa/Casablanca at UTC+0 (still 2026-12-31), Python's tzdata at
    UTC+1 (already 2027-01-01). The read must not decide by PostgreSQL's calendar."""
    tick = parse_instant("2026-12-31T23:00:00Z")
    with engine.connect() as conn:
        postgres_day = conn.execute(text("SELECT (CAST(:t AS timestamptz) AT TIME ZONE 'Africa/Casablanca')::date"),
                                    {"t": tick}).scalar_one()
    python_day = local_date(tick, "Africa/Casablanca")
    yesterday = (python_day - timedelta(days=1)).isoformat()
    duty_id = add_duty(engine, frequency="daily", timezone="Africa/Casablanca",
                       complete_from=yesterday, complete_through=yesterday)
    run(engine, tick.isoformat(), periods_between(*open_range("daily", tick, 0)), frequency="daily")
    # With the versions pinned here the days differ by one; a read by PostgreSQL's
    # calendar took the span as covering today, and the task was never made.
    assert postgres_day in (python_day, python_day - timedelta(days=1))
    assert task_keys(engine, duty_id) == [python_day.isoformat()]


def test_a_dispatch_keeps_the_collector_off_only_while_it_runs(engine, monkeypatch):
    """dispatch() keeps the garbage collector from running while its pages run, and turns
    it back on whether it returns or fails: left off, the process's cyclic garbage would
    never be collected. A process that runs with the collector off keeps it off."""
    add_duty(engine)
    assert gc.isenabled()
    during = []
    real_plan = dispatch_run.plan

    def watched(*args, **kwargs):
        during.append(gc.isenabled())
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(dispatch_run, "plan", watched)
    run(engine, "2026-08-20T12:00:00Z", months("2026-08", "2026-08"))
    assert during == [False] and gc.isenabled()

    def failing(*args, **kwargs):
        raise RuntimeError("planning failed")

    monkeypatch.setattr(dispatch_run, "plan", failing)
    with pytest.raises(RuntimeError, match="planning failed"):
        run(engine, "2026-09-20T12:00:00Z", months("2026-09", "2026-09"))
    assert gc.isenabled()

    monkeypatch.setattr(dispatch_run, "plan", real_plan)
    gc.disable()
    try:
        run(engine, "2026-10-20T12:00:00Z", months("2026-10", "2026-10"))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_dispatch_ending_leaves_the_collector_off_for_a_concurrent_one(engine, monkeypatch):
    """Two dispatches in one process (two steps of an in-process executor): the one that
    ends first does not turn the collector back on under the other, and the last one out
    does."""
    add_duty(engine)
    add_duty(engine, frequency="daily")
    monthly_inside, daily_done = threading.Event(), threading.Event()
    monthly_saw = []
    real_plan = dispatch_run.plan

    def monthly_waits_for_daily(*args, frequency, **kwargs):
        if frequency == "monthly":
            monthly_inside.set()
            assert daily_done.wait(timeout=60)
            monthly_saw.append(gc.isenabled())
        return real_plan(*args, frequency=frequency, **kwargs)

    monkeypatch.setattr(dispatch_run, "plan", monthly_waits_for_daily)
    with ThreadPoolExecutor(max_workers=1) as pool:
        monthly = pool.submit(run, engine, "2026-08-20T12:00:00Z", months("2026-08", "2026-08"))
        assert monthly_inside.wait(timeout=60)
        try:
            run(engine, "2026-08-20T12:00:00Z", [period_containing("daily", date(2026, 8, 20))], frequency="daily")
        finally:
            daily_done.set()
        monthly.result()
    assert monthly_saw == [False]
    assert gc.isenabled()


def test_a_child_forked_during_a_dispatch_has_its_collector_on(engine, monkeypatch):
    """A process forked while a dispatch runs (a multiprocessing pool started by another
    thread) runs no dispatch: it must not inherit the collector switched off for good."""
    add_duty(engine)
    real_plan = dispatch_run.plan
    children = []

    def forking(*args, **kwargs):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if gc.isenabled() else 1)
        children.append(os.waitpid(pid, 0)[1])
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(dispatch_run, "plan", forking)
    run(engine, "2026-08-20T12:00:00Z", months("2026-08", "2026-08"))
    assert [os.waitstatus_to_exitcode(status) for status in children] == [0]


def test_a_pages_cursor_dumps_bytea_as_psycopg_dumps_bytes_and_leaves_the_connection_alone(engine):
    """The workspaces a night COPYs as bytea (millions of fields) go through the dumper
    psycopg uses for bytes (compiled), not the one it keeps for bytea, dbapi20's, which
    calls into the interpreter for each; the pooled connection keeps psycopg's own map."""
    bytea = psycopg.adapters.types["bytea"].oid
    with engine.connect() as conn:
        cursor = writing._page_cursor(conn)
        page_dumper = cursor.adapters.get_dumper_by_oid(bytea, Format.BINARY)
        connection_dumper = conn.connection.driver_connection.adapters.get_dumper_by_oid(bytea, Format.BINARY)
    assert page_dumper is psycopg.adapters.get_dumper(bytes, PyFormat.BINARY)
    assert connection_dumper is psycopg.adapters.get_dumper_by_oid(bytea, Format.BINARY)
    assert connection_dumper is not page_dumper


# What PostgreSQL writes when a page is first read after a write (hint bits, with data
# checksums on; pruning dead versions, "PRUNE" before PostgreSQL 17): any reader's, not the dispatch's.
READS_HOUSEKEEPING = ("FPI_FOR_HINT", "PRUNE_ON_ACCESS", "PRUNE")


def _wal_since(admin_url: str, start_lsn: str, database_oid: int) -> list[tuple]:
    """The WAL records written since `start_lsn` that are this database's doing: a block of
    one of its relations, or a transaction's commit or abort (a transaction that took an id,
    even for a temporary table, which writes no other WAL). The server's own bookkeeping
    (checkpoints, standby snapshots) and what reading sets are not."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        end = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        if end == start_lsn:
            return []
        # Records are read once flushed: a commit that took an id (made after `end`) flushes them.
        with conn.transaction():
            conn.execute("CREATE TEMPORARY TABLE flush_the_wal ()")
        return [row for row in conn.execute(
            "SELECT resource_manager, record_type, xid, block_ref FROM pg_get_wal_records_info(%s, %s)",
            (start_lsn, end)).fetchall()
            if (row[0] == "Transaction" or f"/{database_oid}/" in (row[3] or "")) and row[1] not in READS_HOUSEKEEPING]


def quiet_autovacuum(admin_url: str) -> None:
    """The first run filled the tables enough for the server's autoanalyze, whose commit in
    the middle of the measurement would be the server's write, not the backfill's."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for (table,) in conn.execute("SELECT oid::regclass::text FROM pg_class "
                                     "WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'").fetchall():
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        deadline = time.monotonic() + 60
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
                           ).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.1)


def test_a_second_identical_backfill_writes_no_wal_and_takes_no_transaction_id(test_server, database_url, engine):
    """README and SPEC promise that a backfill run again writes nothing of any kind. Rows
    are not enough to prove it: a transaction id, a temporary table's catalog rows and a
    commit record are writes too. Measured from a fresh pool (whose connections have no
    temporary tables yet) and from a warm one, over several pages."""
    from sqlalchemy import make_url

    admin = make_url(test_server.require_admin("reading the WAL with pg_walinspect")).set(
        database=make_url(database_url).database).render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        database_oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
    many_duties(engine, 300)
    requested = months("2025-08", "2026-08")
    first = run(engine, "2026-08-25T12:00:00Z", requested, mode=Mode.BACKFILL, page_size=100)
    assert first.total("created") > 3000
    quiet_autovacuum(admin)
    fresh = create_engine(driver_url(database_url))
    try:
        for pool in (fresh, engine):
            with psycopg.connect(admin, autocommit=True) as conn:
                start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            again = dispatch(pool, frequency="monthly", mode=Mode.BACKFILL,
                             as_of=parse_instant("2026-08-25T12:00:00Z"), requested=requested, page_size=100)
            assert again.pages == 3 and again.total("created") == 0
            assert again.total("existing") == first.total("created") + first.total("existing")
            assert _wal_since(admin, start, database_oid) == []
    finally:
        fresh.dispose()


@pytest.mark.parametrize("change", ["moved", "deleted", "refrequenced"])
def test_a_duty_changed_between_the_read_and_the_bulk_write_is_written_as_it_stands(engine, change):
    """The bulk path writes tasks with the workspace the page read, and moves a duty only
    while its row still has it; a duty changed since the read sends the page to
    insert_careful, which takes every duty as it stands: no task names a workspace its
    duty no longer has, and every other duty of the page gets its task."""
    changed, other = add_duty(engine, frequency="monthly"), add_duty(engine, frequency="monthly")
    requested = months("2026-08", "2026-08")
    page = next(read_pages(engine, "monthly", 100))
    page_plan = plan(page, frequency="monthly", mode=Mode.BACKFILL, as_of=parse_instant("2026-11-30T12:00:00Z"),
                     requested=requested)
    assert page_plan.after_dispatched
    moved_to = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute({
            "moved": update(duty).where(duty.c.id == changed).values(workspace_id=moved_to),
            "deleted": duty.delete().where(duty.c.id == changed),
            "refrequenced": update(duty).where(duty.c.id == changed).values(frequency="weekly"),
        }[change])
    ensure_partitions(engine, [p.key for p in requested])
    written = write_plan(engine, page_plan, "monthly")
    assert written.written_again and not written.copied
    with engine.connect() as conn:
        tasks = dict(conn.execute(text("SELECT duty_id, workspace_id FROM task")).all())
        workspaces = dict(conn.execute(text("SELECT id, workspace_id FROM duty")).all())
    assert tasks == ({changed: moved_to, other: workspaces[other]} if change == "moved" else
                     {other: workspaces[other]})
