"""No tenant's transaction holds the night back (issue 37).

A tenant session (role rota_app, its workspace set as README's "Add a duty" shows) holds a
lock of its own on one duty, or on duty or task whole, while a scheduled dispatch runs on
other threads.
Each dispatch must finish while the tenant still holds what it holds, with every other
duty's task made; a duty whose row is locked against new references (FOR UPDATE, an
uncommitted DELETE) is reported by id, in the report and the check, and gets its task from
the first run after the tenant lets go."""

import gc
import logging
import uuid

import psycopg
import pytest
from sqlalchemy import text

from dagster import AssetCheckSeverity, DagsterInstance, materialize

from rota.pipelines.definitions import defs
from rota.pipelines.dispatch import writing
from rota.pipelines.dispatch.assets import COMPLETENESS_CHECK, MODE_TAG
from rota.pipelines.dispatch.completeness import find_gaps
from rota.pipelines.dispatch.planner import Mode, Plan
from rota.pipelines.dispatch.run import dispatch
from rota.pipelines.periods.calendar import open_range, parse_instant, periods_between
from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from rota.resources.database.server import libpq_url
from tests.helpers import duty_values, insert_duties, keys_by_duty, last_dispatched, run_while_held, tenant

AS_OF = parse_instant("2026-12-02T12:00:00Z")
TODAY = "2026-12-02"
WORKSPACES = [uuid.UUID(int=n) for n in range(1, 4)]
DUTIES = 600
# How long a dispatch may take while a tenant holds its lock before the test calls it
# stuck: it takes about a second here, and the tenant holds on for longer.
BOUND = 20

# What the tenant does, and what it means for the duty it touches: "made" (its task is made
# now), "made, marks deferred" (made, but the lock keeps the row's marks where they are), or
# "held" (the row is locked against new references: its task waits for the first run after
# the tenant lets go).
HOLDS = {
    "update title": ("UPDATE duty SET title = 'renamed, not committed' WHERE id = %s", "made, marks deferred"),
    "select for no key update": ("SELECT 1 FROM duty WHERE id = %s FOR NO KEY UPDATE", "made, marks deferred"),
    "select for share": ("SELECT 1 FROM duty WHERE id = %s FOR SHARE", "made, marks deferred"),
    "select for key share": ("SELECT 1 FROM duty WHERE id = %s FOR KEY SHARE", "made"),
    "select for update": ("SELECT 1 FROM duty WHERE id = %s FOR UPDATE", "held"),
    "delete, not committed": ("DELETE FROM duty WHERE id = %s", "held"),
}


def _requested():
    return periods_between(*open_range("daily", AS_OF, 0))


def _dispatch(engine):
    return dispatch(engine, frequency="daily", mode=Mode.SCHEDULED, as_of=AS_OF, requested=_requested(),
                    page_size=200, writers=2)


def _duties(engine) -> list[int]:
    return insert_duties(engine, [duty_values(WORKSPACES[n % len(WORKSPACES)], frequency="daily")
                                  for n in range(DUTIES)])


def dispatch_while_held(engine, session: psycopg.Connection, work=None):
    """A dispatch (or `work`), run while `session` holds its transaction open."""
    return run_while_held(session, work or (lambda: _dispatch(engine)), BOUND)


def _hold(database_url, workspace, statement: str, *params) -> psycopg.Connection:
    session = tenant(database_url, workspace)
    session.autocommit = False
    session.execute(statement, params)
    return session


def _insert_path(engine, duty_ids):
    """Make the dispatch's pages take the path that looks for existing tasks: one duty of
    each page already carries today as its last dispatched period."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE duty SET last_dispatched_period = :key WHERE id = ANY(:ids)"),
                     {"key": TODAY, "ids": duty_ids[::150]})


@pytest.mark.parametrize("path", ["bulk", "insert"])
@pytest.mark.parametrize("hold", list(HOLDS))
def test_a_tenant_lock_on_one_duty_holds_back_no_other(database_url, engine, hold, path, caplog):
    caplog.set_level(logging.INFO, logger="rota.pipelines.dispatch.writing")
    duty_ids = _duties(engine)
    if path == "insert":
        _insert_path(engine, duty_ids)
    locked = duty_ids[len(duty_ids) // 2 + 1]
    statement, outcome = HOLDS[hold]
    session = _hold(database_url, WORKSPACES[(len(duty_ids) // 2 + 1) % len(WORKSPACES)], statement, locked)

    report = dispatch_while_held(engine, session)

    tasks = keys_by_duty(engine)
    others = [d for d in duty_ids if d != locked]
    assert [d for d in others if tasks.get(d) != [TODAY]] == []
    if outcome == "held":
        assert locked not in tasks
        assert report.held == {locked}
        gaps = find_gaps(engine, frequency="daily", mode=Mode.SCHEDULED, as_of=AS_OF, requested=_requested(),
                         held=report.held)
        assert gaps.count == 0 and gaps.held == [(locked, TODAY)]
        assert f"duty {locked} has no task for {TODAY}" in gaps.describe()
        assert "locked by another transaction" in gaps.describe()
    else:
        assert tasks[locked] == [TODAY]
        assert report.held == set()
        assert report.marks_deferred == ({locked} if outcome == "made, marks deferred" else set())
        assert last_dispatched(engine, locked) == (None if outcome == "made, marks deferred" else TODAY)
    # Only the locked duty's page was written again (page_size 200), and on the bulk path
    # only the held duty went to insert_careful: the page's others were still COPYed.
    assert report.pages_written_again <= 1
    assert report.pages_copied == (DUTIES // 200 if path == "bulk" else 0)
    around = "writing the page around 1 of its duties, which another transaction holds"
    assert (around in caplog.text) == (path == "bulk" and hold != "select for key share")
    made = sum(len(keys) for keys in tasks.values())
    assert report.total("created") == report.for_period(TODAY)["created"] == made
    assert report.total("existing") == 0
    assert report.total("held") == (1 if outcome == "held" else 0)

    # The tenant has let go (dispatch_while_held rolled it back): the next run completes
    # the duty and brings its marks up to date.
    again = _dispatch(engine)
    assert again.held == set()
    assert keys_by_duty(engine).get(locked) == [TODAY]
    assert last_dispatched(engine, locked) == TODAY
    assert find_gaps(engine, frequency="daily", mode=Mode.SCHEDULED, as_of=AS_OF,
                     requested=_requested()).count == 0


@pytest.mark.parametrize("path", ["bulk", "insert"])
@pytest.mark.parametrize("hold", ["update title", "select for update"])
def test_a_page_written_again_leaves_no_plan_for_the_collector(database_url, engine, hold, path):
    """A dispatch runs with the garbage collector off (run.py), so a page its fast path
    could not write must leave nothing in a reference cycle: an error kept by a frame its
    traceback leads back to would hold the page's plan until the night ends. With the
    collector off here too, every plan must be gone by reference counting alone."""
    duty_ids = _duties(engine)
    if path == "insert":
        _insert_path(engine, duty_ids)
    locked = duty_ids[len(duty_ids) // 2 + 1]
    session = _hold(database_url, WORKSPACES[(len(duty_ids) // 2 + 1) % len(WORKSPACES)], HOLDS[hold][0], locked)
    gc.collect()
    gc.disable()
    try:
        report = dispatch_while_held(engine, session)
        plans = sum(isinstance(o, Plan) for o in gc.get_objects())
    finally:
        gc.enable()
    assert report.pages_written_again == 1
    assert plans == 0


def test_a_scheduled_run_through_dagster_names_the_held_duty_in_its_log_and_check(database_url, engine):
    duty_ids = _duties(engine)
    locked = duty_ids[7]
    session = _hold(database_url, WORKSPACES[7 % len(WORKSPACES)], HOLDS["select for update"][0], locked)
    instance = DagsterInstance.ephemeral()
    partition = _requested()[0].partition_key

    result = dispatch_while_held(engine, session, lambda: materialize(
        [defs.resolve_assets_def("daily_tasks")], instance=instance, run_config={
            "ops": {"daily_tasks": {"config": {"as_of": AS_OF.isoformat()}}}},
        tags={PARTITION_RANGE_START_TAG: partition, PARTITION_RANGE_END_TAG: partition,
              MODE_TAG: "scheduled"}))

    assert result.success
    # The asset's every check ran, as a "Materialize" runs them; this one is the partition's.
    [check] = [c for c in result.get_asset_check_evaluations() if c.check_name == COMPLETENESS_CHECK]
    assert check.partition == partition and not check.passed
    assert check.severity == AssetCheckSeverity.WARN
    assert check.metadata["missing"].value == 0 and check.metadata["waiting_on_a_lock"].value == 1
    assert check.metadata["first_waiting"].value == [[locked, TODAY]]
    assert "first_missing" not in check.metadata
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    [warning] = [message for message in logs if "given no task this run" in message]
    assert f"duty ids {locked}" in warning
    assert len(keys_by_duty(engine)) == DUTIES - 1


@pytest.mark.parametrize("statement", [
    "SELECT * FROM dispatch_page_lock WHERE frequency = 'daily' FOR UPDATE",
    "SELECT * FROM dispatch_page_lock FOR KEY SHARE",
    "SELECT * FROM dispatch_page_lock",
    "LOCK TABLE dispatch_page_lock IN ACCESS EXCLUSIVE MODE",
    "LOCK TABLE dispatch_page_lock IN ACCESS SHARE MODE",
])
def test_no_tenant_can_take_the_lock_every_page_holds(database_url, engine, statement):
    """A run tells another run's page from a tenant by dispatch_page_lock (writing.py's
    move_deferred_marks). A tenant who could hold it would make every page wait, or pass
    its own row locks off as a page's and hold a run back for MARKS_WAIT."""
    with tenant(database_url, WORKSPACES[0]) as session:
        session.autocommit = False  # LOCK TABLE is refused outside a transaction whoever asks
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            session.execute(statement)


def test_a_page_of_another_frequency_keeps_no_run_waiting_on_a_tenants_marks(database_url, engine, monkeypatch):
    """The five frequencies' runs start on the same tick. A daily duty's mark a tenant
    holds back is reported once no daily page is being written, whatever the monthly
    run's pages are doing: they hold monthly duties only."""
    monkeypatch.setattr(writing, "MARKS_WAIT", 3600.0)
    duty_ids = _duties(engine)
    locked = duty_ids[10]
    monthly_page = psycopg.connect(libpq_url(database_url))
    monthly_page.execute("SELECT 1 FROM dispatch_page_lock WHERE frequency = 'monthly' FOR KEY SHARE")
    session = _hold(database_url, WORKSPACES[10 % len(WORKSPACES)], HOLDS["update title"][0], locked)
    try:
        report = dispatch_while_held(engine, session)
    finally:
        monthly_page.close()
    assert report.marks_deferred == {locked}
    assert len(keys_by_duty(engine)) == DUTIES


# A tenant's hold on duty or task whole, in a transaction left open: each takes a table
# lock that the night's DDL (a new partition of task) must not queue behind, or every
# reader would queue behind the DDL in turn.
TABLE_HOLDS = {
    "a read of task left open": "SELECT count(*) FROM task",
    "task locked in ACCESS SHARE mode": "LOCK TABLE task IN ACCESS SHARE MODE",
    "duty locked in ACCESS SHARE mode": "LOCK TABLE duty IN ACCESS SHARE MODE",
    "task rows locked FOR UPDATE": "SELECT 1 FROM task FOR UPDATE",
    "a task updated, not committed": "UPDATE task SET status = 'done'",
    # Any role may take any advisory lock: rota's partition making must not use one.
    "the advisory lock partitions were made under": "SELECT pg_advisory_xact_lock(hashtext('rota task partitions'))",
}


def _partitions(engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'task'::regclass")).scalars())


@pytest.mark.parametrize("hold", list(TABLE_HOLDS))
def test_a_tenant_holding_a_table_delays_neither_the_night_nor_other_readers(database_url, engine, hold):
    duty_ids = _duties(engine)
    # Yesterday's tasks exist, so the tenant's statements have rows to lock; today's
    # partition does not, so the run must make it while the tenant holds on.
    yesterday = dispatch(engine, frequency="daily", mode=Mode.SCHEDULED, as_of=parse_instant("2026-11-24T12:00:00Z"),
                         requested=periods_between(*open_range("daily", parse_instant("2026-11-24T12:00:00Z"), 0)))
    assert yesterday.total("created") == DUTIES
    before = _partitions(engine)
    session = _hold(database_url, WORKSPACES[0], TABLE_HOLDS[hold])
    reader = tenant(database_url, WORKSPACES[1])

    def night_and_a_reader():
        report = _dispatch(engine)
        # Another tenant reads task once the partition exists: no DDL left queued ahead of it.
        reader.execute("SET statement_timeout = '10s'")
        return report, reader.execute("SELECT count(*) FROM task").fetchone()[0]

    report, seen = dispatch_while_held(engine, session, night_and_a_reader)
    reader.close()

    assert report.total("created") == DUTIES and report.held == set()
    assert seen == 2 * DUTIES // len(WORKSPACES)
    assert _partitions(engine) - before == {"task_2026_12_a"}
    assert [d for d in duty_ids if keys_by_duty(engine).get(d) != ["2026-11-24", TODAY]] == []


def test_a_locked_duty_whose_task_exists_is_not_reported_held(database_url, engine):
    duty_ids = _duties(engine)
    _dispatch(engine)
    complete, missing = duty_ids[3], duty_ids[4]
    with engine.begin() as conn:  # one task goes missing; both duties are read again
        conn.execute(text("DELETE FROM task WHERE duty_id = :d"), {"d": missing})
        conn.execute(text("UPDATE duty SET complete_from = NULL, complete_through = NULL WHERE id = :d"),
                     {"d": complete})
    session = _hold(database_url, WORKSPACES[3 % len(WORKSPACES)], HOLDS["select for update"][0], complete)

    report = dispatch_while_held(engine, session)

    assert report.pages_written_again == 1  # the lock sent the page to insert_careful
    assert report.held == set() and report.total("held") == 0
    assert keys_by_duty(engine)[missing] == [TODAY]
