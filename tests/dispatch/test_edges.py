"""Exactly once at the edges (issue 11): a later period's backfill never hides the current
one, a duty's frequency is fixed once it has tasks, no task outlives its duty whoever
writes, and tenants cannot create, delete or re-run what the system produces."""

import logging
import random
from datetime import date, timedelta

import psycopg
import pytest
from sqlalchemy import create_engine, insert, text, update
from sqlalchemy.exc import DBAPIError


from rota.pipelines.dispatch import run as dispatch_run
from rota.pipelines.dispatch.assets import COMPLETENESS_CHECK, MODE_TAG
from rota.pipelines.dispatch.completeness import find_gaps
from rota.pipelines.dispatch.planner import Mode, plan
from rota.pipelines.dispatch.reading import read_pages
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.dispatch.writing import ensure_partitions, write_plan
from rota.pipelines.periods.calendar import open_range, parse_instant, period_containing, periods_between
from rota.pipelines.queue.enqueue import enqueue_scheduled
from rota.pipelines.queue.jobs import register_job
from rota.resources.database.schema import FREQUENCIES, MAX_LEAD_DAYS, duty, task
from rota.resources.database.server import driver_url
from tests.helpers import (
    gaps_after,
    add_duty,
    delete_duty_with_its_tasks,
    duty_values,
    insert_duties,
    outcome_once_released,
    planned_tasks,
    run_while_held,
    task_keys,
    tenant,
)
from tests.dagster.test_dagster import run_asset


def _scheduled(engine, frequency, tick):
    at = parse_instant(tick)
    return dispatch(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=at,
                    requested=periods_between(*open_range(frequency, at, MAX_LEAD_DAYS)))


def test_a_backfill_of_a_later_period_does_not_hide_the_current_one(engine):
    duty_id = add_duty(engine, frequency="monthly", timezone="UTC", lead_days=40)
    january = period_containing("monthly", date(2027, 1, 1))
    report = dispatch(engine, frequency="monthly", mode=Mode.BACKFILL,
                      as_of=parse_instant("2026-12-25T12:00:00+00:00"), requested=[january])
    assert report.total("created") == 1 and task_keys(engine, duty_id) == ["2027-01"]
    report = _scheduled(engine, "monthly", "2026-12-25T13:00:00Z")
    assert task_keys(engine, duty_id) == ["2026-12", "2027-01"]
    assert report.total("created") == 1 and report.total("existing") == 1


def test_a_backfill_inside_the_lead_window_does_not_hide_the_days_before_it(engine):
    """A daily duty with a week's lead: a backfill of its last visible day leaves the six
    before it for the next scheduled run, which makes all six."""
    duty_id = add_duty(engine, frequency="daily", timezone="Asia/Kathmandu", lead_days=6)
    at = parse_instant("2026-12-10T06:00:00Z")
    dispatch(engine, frequency="daily", mode=Mode.BACKFILL, as_of=at,
             requested=[period_containing("daily", date(2026, 12, 16))])
    _scheduled(engine, "daily", "2026-12-10T07:00:00Z")
    assert task_keys(engine, duty_id) == [f"2026-12-{d}" for d in range(10, 17)]


def test_a_wider_window_is_filled_by_the_next_scheduled_run(engine):
    """The span a scheduled run proved covers periods its window then excluded; widening the
    window clears it, so the very next tick makes them."""
    duty_id = add_duty(engine, frequency="daily", lead_days=30, effective_to=date(2026, 12, 20))
    _scheduled(engine, "daily", "2026-12-10T12:00:00Z")
    assert len(task_keys(engine, duty_id)) == 11
    with engine.begin() as conn:
        conn.execute(text("UPDATE duty SET effective_to = NULL"))
    _scheduled(engine, "daily", "2026-12-10T13:00:00Z")
    assert len(task_keys(engine, duty_id)) == 31


def test_a_task_deleted_between_a_pages_read_and_its_write_is_made_by_the_next_run(engine):
    """The write records its span only if the duty row is still the one it planned from."""
    duty_id = add_duty(engine, frequency="daily", lead_days=3)
    _scheduled(engine, "daily", "2026-12-10T12:00:00Z")
    at = parse_instant("2026-12-11T12:00:00Z")
    requested = periods_between(*open_range("daily", at, MAX_LEAD_DAYS))
    [page] = list(read_pages(engine, "daily", 100, scheduled_at=at))
    page_plan = plan(page, frequency="daily", mode=Mode.SCHEDULED, as_of=at, requested=requested)
    assert [t.period_key for t in planned_tasks(page_plan)] == ["2026-12-14"]  # the span vouched for the rest
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM task WHERE period_key = '2026-12-12'"))
    write_plan(engine, page_plan, "daily")
    _scheduled(engine, "daily", "2026-12-11T13:00:00Z")
    assert task_keys(engine, duty_id) == [f"2026-12-{d}" for d in range(10, 15)]


def test_a_duty_with_tasks_keeps_its_frequency_and_kind(database_url, engine, workspace):
    duty_id = add_duty(engine, frequency="weekly", timezone="UTC", workspace_id=workspace)
    fresh = add_duty(engine, frequency="weekly", timezone="UTC")
    _scheduled(engine, "weekly", "2026-12-09T12:00:00Z")
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM task WHERE duty_id = :d"), {"d": fresh})
    for change, column in (("frequency = 'monthly'", "frequency"), ("kind = 'standing', frequency = NULL", "kind")):
        with pytest.raises(DBAPIError, match=rf"duty {duty_id}.*{column}.*cannot change.*new duty"):
            with engine.begin() as conn:
                conn.execute(text(f"UPDATE duty SET {change} WHERE id = :d"), {"d": duty_id})
        with tenant(database_url, workspace) as conn:
            with pytest.raises(psycopg.errors.CheckViolation, match=rf"duty {duty_id}.*{column}.*cannot change"):
                conn.execute(f"UPDATE duty SET {change} WHERE id = %s", (duty_id,))
    with engine.begin() as conn:  # a duty without tasks may still change
        conn.execute(text("UPDATE duty SET frequency = 'monthly' WHERE id = :d"), {"d": fresh})
    _scheduled(engine, "monthly", "2026-12-09T13:00:00Z")
    assert task_keys(engine, fresh) == ["2026-12"] and task_keys(engine, duty_id) == ["2026-W50"]


def test_a_frequency_change_racing_a_task_insert_waits_and_is_refused(database_url, engine, workspace):
    duty_id = add_duty(engine, workspace_id=workspace, frequency="weekly")
    ensure_partitions(engine, ["2026-W50"])
    writer = create_engine(driver_url(database_url))
    with writer.connect() as inserting:
        inserting.execute(insert(task), [_task_row(duty_id, workspace, "2026-W50")])  # uncommitted

        def change():
            with engine.begin() as conn:
                conn.execute(text("UPDATE duty SET frequency = 'monthly' WHERE id = :d"), {"d": duty_id})

        outcome = outcome_once_released(engine, inserting, "the frequency change", change)
    writer.dispose()
    assert "frequency" in outcome.get("error", ""), outcome
    with engine.connect() as conn:
        assert conn.execute(text("SELECT frequency FROM duty WHERE id = :d"), {"d": duty_id}).scalar_one() == "weekly"


def _task_row(duty_id, workspace_id, key="2026-08"):
    return {"duty_id": duty_id, "workspace_id": workspace_id, "period_key": key,
            "period_start": date(2026, 8, 1), "due_date": date(2026, 8, 31), "visible_from": date(2026, 8, 31)}


def _orphans(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM task t WHERE NOT EXISTS (SELECT 1 FROM duty d WHERE d.id = t.duty_id)"
        )).scalar_one()


def test_an_insert_in_flight_holds_off_the_deletion_of_its_duty(database_url, engine, workspace):
    """Any role's task insert: the deletion of the duty waits for it and then fails."""
    duty_id = add_duty(engine, workspace_id=workspace)
    ensure_partitions(engine, ["2026-08"])
    writer = create_engine(driver_url(database_url))
    with writer.connect() as inserting:
        inserting.execute(insert(task), [_task_row(duty_id, workspace)])  # uncommitted
        outcome = outcome_once_released(engine, inserting, "the duty's deletion",
                                        lambda: delete_duty_with_its_tasks(engine, duty_id))
    writer.dispose()
    assert "task_duty_fkey" in outcome.get("error", "") or "still has tasks" in outcome.get("error", ""), outcome
    assert _orphans(engine) == 0 and task_keys(engine, duty_id) == ["2026-08"]


def test_a_deletion_in_flight_refuses_a_task_insert_for_its_duty(database_url, engine, workspace):
    """The other order: the duty's deletion goes first, the insert waits for it and fails."""
    duty_id = add_duty(engine, workspace_id=workspace)
    ensure_partitions(engine, ["2026-08"])
    deleter = create_engine(driver_url(database_url))
    with deleter.connect() as deleting:
        deleting.execute(text("DELETE FROM duty WHERE id = :d"), {"d": duty_id})  # uncommitted

        def insert_task():
            with engine.begin() as conn:
                conn.execute(insert(task), [_task_row(duty_id, workspace)])

        outcome = outcome_once_released(engine, deleting, "the task insert", insert_task)
    deleter.dispose()
    assert "task_duty_fkey" in outcome.get("error", "") or "does not exist" in outcome.get("error", ""), outcome
    assert _orphans(engine) == 0


def test_a_tenant_cannot_insert_or_delete_tasks(database_url, engine, workspace):
    duty_id = add_duty(engine, workspace_id=workspace)
    _scheduled(engine, "monthly", "2026-12-09T12:00:00Z")
    with tenant(database_url, workspace) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table task"):
            conn.execute(
                "INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from) "
                "VALUES (%s, %s, '2027-01', '2027-01-01', '2027-01-31', '2027-01-31')", (duty_id, workspace))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table task"):
            conn.execute("DELETE FROM task WHERE duty_id = %s", (duty_id,))
        conn.execute("UPDATE task SET status = 'done', updated_at = now() WHERE duty_id = %s", (duty_id,))
    assert task_keys(engine, duty_id) == ["2026-12"]


def test_a_tenant_cannot_rerun_or_queue_work(database_url, engine, workspace):
    job_id = register_job(engine, "report", schedule="* * * * *", workspace_id=workspace)
    run = enqueue_scheduled(engine, job_id, parse_instant("2026-12-09T12:00:00Z"))
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET state = 'succeeded', finished_at = now() WHERE id = :r"),
                     {"r": run.run_id})
    with tenant(database_url, workspace) as conn:
        assert conn.execute("SELECT state FROM job_queue").fetchall() == [("succeeded",)]
        for statement in (
            "UPDATE job_queue SET state = 'queued'",
            f"INSERT INTO job_queue (job_id, workspace_id, scheduled_for) VALUES ({job_id}, '{workspace}', now())",
            "DELETE FROM job_queue",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table job_queue"):
                conn.execute(statement)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM job_queue")).scalar_one() == "succeeded"


# What rota_app may do (SPEC §2), tried table by table and verb by verb as a tenant with
# its workspace set. Each statement touches only the tenant's own rows, so a refusal can
# only come from a missing privilege.
GRANTS = [
    ("duty", "SELECT", "SELECT count(*) FROM duty", True),
    ("duty", "INSERT", "INSERT INTO duty (workspace_id, title, kind, frequency, timezone) "
                       "VALUES ('{w}', 'new', 'recurring', 'daily', 'UTC')", True),
    ("duty", "UPDATE", "UPDATE duty SET title = 'renamed' WHERE id = {d}", True),
    ("duty", "DELETE", "DELETE FROM duty WHERE id = {spare}", True),
    ("task", "SELECT", "SELECT count(*) FROM task", True),
    ("task", "UPDATE status", "UPDATE task SET status = 'done', updated_at = now() WHERE duty_id = {d}", True),
    ("task", "UPDATE period_key", "UPDATE task SET period_key = '2020-01' WHERE duty_id = {d}", False),
    ("task", "UPDATE due_date", "UPDATE task SET due_date = due_date WHERE duty_id = {d}", False),
    ("task", "INSERT", "INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from) "
                       "VALUES ({d}, '{w}', '2030-01', '2030-01-01', '2030-01-31', '2030-01-31')", False),
    ("task", "DELETE", "DELETE FROM task WHERE duty_id = {d}", False),
    ("task", "TRUNCATE", "TRUNCATE task", False),
    ("event", "SELECT", "SELECT count(*) FROM event", True),
    ("event", "INSERT", "INSERT INTO event (workspace_id, type) VALUES ('{w}', 'ping')", True),
    ("event", "UPDATE", "UPDATE event SET type = 'pong'", False),
    ("event", "DELETE", "DELETE FROM event", False),
    ("job_queue", "SELECT", "SELECT count(*) FROM job_queue", True),
    ("job_queue", "INSERT", "INSERT INTO job_queue (job_id, workspace_id, source, source_ref) "
                            "VALUES ({job}, '{w}', 'mine', 'x')", False),
    ("job_queue", "UPDATE", "UPDATE job_queue SET state = 'queued'", False),
    ("job_queue", "DELETE", "DELETE FROM job_queue", False),
    ("job", "SELECT", "SELECT count(*) FROM job", True),
    ("job", "INSERT", "INSERT INTO job (name) VALUES ('tenant job')", False),
    ("job", "UPDATE", "UPDATE job SET enabled = false", False),
    ("job", "DELETE", "DELETE FROM job", False),
    ("iana_timezone", "SELECT", "SELECT count(*) FROM iana_timezone", True),
    ("iana_timezone", "INSERT", "INSERT INTO iana_timezone VALUES ('Mars/Olympus')", False),
]


@pytest.mark.parametrize("table, verb, statement, allowed", GRANTS, ids=[f"{g[0]}-{g[1]}" for g in GRANTS])
def test_what_rota_app_may_do(database_url, engine, workspace, table, verb, statement, allowed):
    duty_id = add_duty(engine, workspace_id=workspace)
    spare = add_duty(engine, workspace_id=workspace)
    _scheduled(engine, "monthly", "2026-12-09T12:00:00Z")
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM task WHERE duty_id = :d"), {"d": spare})
    job_id = register_job(engine, "tenant report", schedule="* * * * *", workspace_id=workspace)
    enqueue_scheduled(engine, job_id, parse_instant("2026-12-09T12:00:00Z"))
    with tenant(database_url, workspace) as conn:
        sql = statement.format(w=workspace, d=duty_id, spare=spare, job=job_id)
        if allowed:
            conn.execute("BEGIN")
            conn.execute(sql)
            conn.execute("ROLLBACK")
        else:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied for table {table}"):
                conn.execute(sql)


# ------------------------------------------------- the pre-filter against the rules

RANDOM_ZONES = ["UTC", "Asia/Shanghai", "America/Los_Angeles", "Pacific/Kiritimati", "Pacific/Pago_Pago",
                "Asia/Kathmandu", "Pacific/Chatham", "America/Santiago", "Australia/Lord_Howe", "Asia/Tehran"]
LEADS = [0, 0, 1, 6, 7, 13, 30, 31, 45, 90, 91, 200, 366]


def _all_tasks(engine) -> set[tuple[int, str]]:
    with engine.connect() as conn:
        return {tuple(row) for row in conn.execute(text("SELECT duty_id, period_key FROM task"))}


def _rules(engine, frequency, mode, at, requested) -> set[tuple[int, str]]:
    """What SPEC §4 makes of every duty as it now is, with no shortcut: the planner over
    all duties, each stripped of the span its last scheduled run proved."""
    everyone = [d._replace(complete_from=None, complete_through=None)
                for page in read_pages(engine, frequency, 1000) for d in page]
    result = plan(everyone, frequency=frequency, mode=mode, as_of=at, requested=requested)
    return {(t.duty_id, t.period_key) for t in planned_tasks(result)}


def _make_behind_the_back(engine, frequency, at, requested, wanted: set[tuple[int, str]]) -> tuple[int, str]:
    """Make, as the owner, the newest of the tasks a scheduled run is about to make, as a
    writer racing it would: a task past its duty's last_dispatched_period."""
    duty_id, key = max(wanted, key=lambda pair: pair[1])
    row = next(d for page in read_pages(engine, frequency, 1000) for d in page if d.id == duty_id)
    page_plan = plan([row._replace(complete_from=None, complete_through=None)], frequency=frequency,
                     mode=Mode.SCHEDULED, as_of=at, requested=requested)
    [made] = [t for t in planned_tasks(page_plan) if t.period_key == key]
    ensure_partitions(engine, [key])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, visible_from) "
                          "SELECT id, workspace_id, :key, :start, :due, :visible FROM duty WHERE id = :id"),
                     {"id": duty_id, "key": key, "start": made.period_start, "due": made.due_date,
                      "visible": made.visible_from})
    return duty_id, key


def _while_a_tenant_holds(database_url, engine, duty_id, work):
    """`work`'s result, run while a tenant (rota_app, in the duty's workspace) holds duty
    `duty_id` FOR UPDATE; failing if it waits on the tenant (run_while_held)."""
    with engine.connect() as conn:
        workspace = conn.execute(text("SELECT workspace_id FROM duty WHERE id = :id"), {"id": duty_id}).scalar_one()
    session = tenant(database_url, workspace)
    try:
        session.autocommit = False
        session.execute("SELECT 1 FROM duty WHERE id = %s FOR UPDATE", (duty_id,))
        return run_while_held(session, work, 20)
    finally:
        session.close()


def test_the_scheduled_shortcut_creates_exactly_what_the_rules_create(database_url, engine, caplog):
    """Random duties through random history: scheduled ticks (now and then one re-executed
    as of an earlier tick), backfills of random ranges as of random instants (later
    periods with a future as_of among them), pauses, archives, edits of window, lead and
    zone, and tasks deleted behind the dispatcher's back. Before every scheduled run the
    rules say which tasks must be new; the run must create exactly those, and the
    pre-filter must have let every duty concerned through. Now and then the newest of
    them is made first behind the dispatcher's back, as a racing writer would: its page,
    which the watermark sends down the COPY path, must be written again around it. Now and
    then a tenant holds one of them FOR UPDATE through the run instead: the run waits on
    no tenant, every other task is made (on a bulk page, around the held duty), the held
    duty's are reported held and judged apart, and the run after the tenant let go makes
    them."""
    caplog.set_level(logging.INFO, logger="rota.pipelines.dispatch.writing")
    rng = random.Random(20261203)

    def some_day():
        return date(2026, 6, 1) + timedelta(days=rng.randrange(500)) if rng.random() < 0.3 else None

    rows = []
    for i in range(240):
        window = sorted((some_day(), some_day()), key=lambda d: d or date.max)
        rows.append(duty_values(timezone=rng.choice(RANDOM_ZONES), frequency=FREQUENCIES[i % 5], title=f"d{i}",
                                lead_days=rng.choice(LEADS),
                                effective_from=window[0] if rng.random() < 0.5 else None,
                                effective_to=window[1] if window[1] and window[1] != window[0] else None))
    ids = insert_duties(engine, rows)
    tick = parse_instant("2026-06-01T00:00:00Z")
    seen = {"skipped by the pre-filter": 0, "backfilled": 0, "made good": 0, "ticks": 0,
            "pages copied": 0, "pages written again": 0, "held by a tenant": 0}
    for _ in range(70):
        step = rng.random()
        if step < 0.12:
            frequency = rng.choice(FREQUENCIES)
            around = (tick + timedelta(days=rng.randint(-60, 200))).date()
            first = period_containing(frequency, around)
            requested = periods_between(first, period_containing(frequency, around + timedelta(days=rng.randint(0, 90))))
            as_of = tick + timedelta(hours=rng.randint(-24, 24 * 120))
            before = _all_tasks(engine)
            expected = _rules(engine, frequency, Mode.BACKFILL, as_of, requested) - before
            dispatch(engine, frequency=frequency, mode=Mode.BACKFILL, as_of=as_of, requested=requested)
            assert _all_tasks(engine) - before == expected
            seen["backfilled"] += len(expected)
            continue
        if step < 0.2:
            with engine.begin() as conn:
                for duty_id in rng.sample(ids, 20):
                    change = rng.choice([
                        {"state": rng.choice(["paused", "active", "active", "archived"])},
                        {"effective_from": some_day(), "effective_to": None},
                        {"effective_from": None, "effective_to": None},
                        {"effective_from": None, "effective_to": (tick + timedelta(days=rng.randint(-10, 60))).date()},
                        {"lead_days": rng.choice(LEADS)},
                        {"timezone": rng.choice(RANDOM_ZONES)},
                    ])
                    conn.execute(update(duty).where(duty.c.id == duty_id).values(**change))
            continue
        if step < 0.25:
            with engine.begin() as conn:  # behind the dispatcher's back, as the owner
                conn.execute(text("DELETE FROM task WHERE id IN (SELECT id FROM task WHERE due_date >= :day "
                                  "ORDER BY random() LIMIT 5)"), {"day": tick.date()})
            continue
        at = tick - timedelta(hours=rng.randint(1, 900)) if step > 0.95 else (
            tick := tick + timedelta(hours=rng.randint(1, 300)))
        seen["ticks"] += 1
        for frequency in FREQUENCIES:
            requested = periods_between(*open_range(frequency, at, MAX_LEAD_DAYS))
            before = _all_tasks(engine)
            expected = _rules(engine, frequency, Mode.SCHEDULED, at, requested) - before
            everyone = sum(len(page) for page in read_pages(engine, frequency, 1000))
            kept = {d.id for page in read_pages(engine, frequency, 1000, scheduled_at=at) for d in page}
            assert {duty_id for duty_id, _ in expected} <= kept, (frequency, at)
            seen["skipped by the pre-filter"] += everyone - len(kept)
            held, held_back = None, set()
            if expected and rng.random() < 0.15:
                raced = _make_behind_the_back(engine, frequency, at, requested, expected)
                expected.discard(raced)
                before.add(raced)
            elif expected and rng.random() < 0.2:
                held = rng.choice(sorted({duty_id for duty_id, _ in expected}))
                held_back = {pair for pair in expected if pair[0] == held}
            def run():
                return dispatch(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=at, requested=requested)
            report = _while_a_tenant_holds(database_url, engine, held, run) if held else run()
            seen["pages copied"] += report.pages_copied
            seen["pages written again"] += report.pages_written_again
            created = _all_tasks(engine) - before
            assert created == expected - held_back, \
                (frequency, at, sorted(expected - created)[:5], sorted(created - expected)[:5])
            assert report.total("created") == len(created) and report.held == ({held} if held else set())
            judged = find_gaps(engine, frequency=frequency, mode=Mode.SCHEDULED, as_of=at, requested=requested,
                               held=report.held)
            assert judged.count == 0 and {duty_id for duty_id, _ in judged.held} <= {held}
            if held:
                # The tenant let go: the next run makes the held duty's tasks, and only those.
                seen["held by a tenant"] += 1
                again = run()
                assert _all_tasks(engine) - before == expected and not again.held
                assert again.total("created") == len(held_back) and gaps_after(engine, again).count == 0
            newest = {}
            for duty_id, key in before:
                newest[duty_id] = max(key, newest.get(duty_id, key))
            # Periods created under a newer task: what a watermark would have hidden.
            seen["made good"] += sum(1 for duty_id, key in created if key < newest.get(duty_id, key))
    # The history exercised what it was meant to.
    assert seen["skipped by the pre-filter"] > 1000 and seen["backfilled"] > 50 and seen["ticks"] > 30, seen
    assert seen["made good"] > 0 and seen["pages copied"] > 10 and seen["pages written again"] > 0, seen
    assert seen["held by a tenant"] > 5 and "writing the page around 1 of its duties" in caplog.text, seen


# ------------------------------------------------------------- the completeness check

def _checks(result):
    """The run's completeness results, one per partition, by partition key."""
    evaluations = result.get_asset_check_evaluations()
    assert {e.check_name for e in evaluations} == {COMPLETENESS_CHECK}
    by_partition = {e.partition: e for e in evaluations}
    assert len(by_partition) == len(evaluations)
    return by_partition


def test_the_check_sees_a_gap_a_moved_span_hid_from_a_scheduled_run(engine):
    hidden = add_duty(engine, frequency="monthly", timezone="UTC")
    fine = add_duty(engine, frequency="monthly", timezone="UTC")
    with engine.begin() as conn:  # behind the dispatcher's back: a span that vouches for nothing
        conn.execute(text("UPDATE duty SET complete_from = '2026-12', complete_through = '2027-01' WHERE id = :d"),
                     {"d": hidden})
    first, last = open_range("monthly", parse_instant("2026-12-10T12:00:00Z"), 0)
    result = run_asset("monthly_tasks", first.partition_key, last.partition_key, as_of="2026-12-10T12:00:00Z",
                       tags={MODE_TAG: "scheduled"})
    assert task_keys(engine, fine) == ["2026-12"] and task_keys(engine, hidden) == []
    [evaluation] = _checks(result).values()
    assert not evaluation.passed and evaluation.partition == "2026-12-01"
    assert evaluation.description == f"1 missing: duty {hidden} has no task for 2026-12"
    assert evaluation.metadata["first_missing"].value == [[hidden, "2026-12"]]
    assert result.asset_materializations_for_node("monthly_tasks") == []  # not done: not shown done


def test_the_check_sees_a_gap_the_planner_never_offered_in_a_backfill(engine, monkeypatch):
    dropped = add_duty(engine, frequency="monthly", timezone="Asia/Kathmandu")
    add_duty(engine, frequency="monthly", timezone="UTC")
    real_plan = dispatch_run.plan

    def forgetful_plan(duties, **kwargs):
        return real_plan([d for d in duties if d.id != dropped], **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(dispatch_run, "plan", forgetful_plan)
        result = run_asset("monthly_tasks", "2026-09-01", "2026-11-01", as_of="2026-12-10T12:00:00Z")
    # Each partition judged on its own, each naming its own gap, and none shown done.
    evaluations = _checks(result)
    assert sorted(evaluations) == ["2026-09-01", "2026-10-01", "2026-11-01"]
    for partition, evaluation in evaluations.items():
        assert not evaluation.passed and evaluation.metadata["missing"].value == 1
        assert evaluation.metadata["first_missing"].value == [[dropped, partition[:7]]]
    assert result.asset_materializations_for_node("monthly_tasks") == []
    again = run_asset("monthly_tasks", "2026-09-01", "2026-11-01", as_of="2026-12-10T12:00:00Z")
    assert all(e.passed for e in _checks(again).values()) and len(_checks(again)) == 3
    assert len(again.asset_materializations_for_node("monthly_tasks")) == 3
