"""The schema as the database holds it: migrations, constraints, time types, RLS."""

import uuid
from datetime import date

import psycopg
import pytest
from sqlalchemy import insert, text
from sqlalchemy.exc import IntegrityError, ProgrammingError

from rota.pipelines.dispatch.writing import ensure_partitions
from rota.resources.database.schema import task
from rota.resources.database.server import libpq_url, with_database
from tests.helpers import add_duty, tenant


def test_no_column_is_a_timestamp_without_time_zone(engine):
    with engine.connect() as conn:
        naive = conn.execute(text(
            "SELECT table_name || '.' || column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND data_type = 'timestamp without time zone'"
        )).scalars().all()
        instants = conn.execute(text(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_schema = 'public' AND data_type = 'timestamp with time zone'"
        )).scalar_one()
    assert naive == [] and instants >= 4


@pytest.mark.parametrize("name, table, columns", [
    ("task_dispatch_identity", "task", ["duty_id", "period_key"]),
    ("job_queue_schedule_identity", "job_queue", ["job_id", "scheduled_for"]),
    ("job_queue_event_identity", "job_queue", ["event_id", "job_id"]),
    ("job_queue_source_identity", "job_queue", ["source", "source_ref"]),
])
def test_every_identity_is_a_plain_unique_constraint(engine, name, table, columns):
    with engine.connect() as conn:
        constraint = conn.execute(text(
            "SELECT c.contype, c.conrelid::regclass::text, array_agg(a.attname ORDER BY k.ord)::text[] "
            "FROM pg_constraint c "
            "CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum "
            "WHERE c.conname = :name GROUP BY c.contype, c.conrelid"
        ), {"name": name}).one()
        # A partial unique index beside the constraint would be a second identity, which
        # binds only some rows; a partial index that is not unique identifies nothing
        # (job_queue_unscheduled_idx finds the runs a schedule cancelled).
        partial = conn.execute(text(
            "SELECT indexrelid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
            "WHERE c.relnamespace = 'public'::regnamespace AND c.relname = :table "
            "AND i.indisunique AND i.indpred IS NOT NULL"
        ), {"table": table}).scalars().all()
    assert constraint == ("u", table, columns)
    assert partial == []


def test_the_claim_reads_the_claim_index_even_with_the_plan_the_server_caches(engine, test_server):
    """A worker claims through job_queue_complete_and_claim, whose plan the server caches
    and, after a few calls, may make generic (blind to the limit and the worker): that
    plan too must find due runs in the claim index, not scan job_queue, and find the
    runs it finished by their ids, never by the claim index's 'running' range, which
    statistics that say few runs are running (as here) would otherwise choose."""
    from rota.pipelines.queue.claims import _COMPLETE_AND_CLAIM
    from rota.pipelines.queue.jobs import register_job

    admin = test_server.require_admin("loading auto_explain to see the plan inside the function")
    job_id = register_job(engine, "report", schedule="* * * * *")
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO job_queue (job_id, scheduled_for, run_at, state, finished_at) "
            "SELECT :j, t, t, CASE WHEN n % 1000 = 0 THEN 'queued' ELSE 'succeeded' END, "
            "CASE WHEN n % 1000 = 0 THEN NULL ELSE t END "
            "FROM generate_series(1, 20000) n, LATERAL (SELECT now() - n * interval '1 minute') AS s(t)"
        ), {"j": job_id})
        conn.execute(text("ANALYZE job_queue"))
    plans: list[str] = []
    with psycopg.connect(libpq_url(with_database(admin, engine.url.database)), autocommit=True) as conn:
        conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                        "auto_explain.log_level = notice", "plan_cache_mode = force_generic_plan"):
            conn.execute(f"SET {setting}")
        claimed = conn.execute(_COMPLETE_AND_CLAIM, {"finished": [1, 2], "worker": "w", "limit": 10,
                                                     "lease": 30.0}).fetchall()
    assert len(claimed) == 10 and claimed[0][0] is None
    (claim,) = [p for p in plans if "CTE due" in p]
    (finish,) = [p for p in plans if "CTE finished" in p]
    assert "job_queue_claim_idx" in claim.split("CTE due")[1].split("CTE claimed")[0], claim
    assert "job_queue_pkey" in finish and "job_queue_claim_idx" not in finish, finish


def test_a_second_task_for_one_duty_and_period_is_refused_by_the_identity(engine, workspace):
    duty_id = add_duty(engine, workspace_id=workspace)
    ensure_partitions(engine, ["2026-08"])
    row = {"duty_id": duty_id, "workspace_id": workspace, "period_key": "2026-08",
           "period_start": date(2026, 8, 1), "due_date": date(2026, 8, 31), "visible_from": date(2026, 8, 31)}
    with engine.begin() as conn:
        conn.execute(insert(task), [row])
    with pytest.raises(IntegrityError, match="task_dispatch_identity"):
        with engine.begin() as conn:
            conn.execute(insert(task), [row])


@pytest.mark.parametrize("overrides, names", [
    ({"timezone": "Mars/Olympus_Mons"}, ["duty_timezone_known", "Mars/Olympus_Mons"]),
    ({"timezone": "UTC+3"}, ["duty_timezone_known", "UTC+3"]),
    ({"timezone": "EST5EDT,M3.2.0,M11.1.0"}, ["duty_timezone_known"]),
    ({"lead_days": 367}, ["duty_lead_days_range"]),
    ({"lead_days": -1}, ["duty_lead_days_range"]),
    ({"effective_from": date(2026, 9, 1), "effective_to": date(2026, 8, 31)}, ["duty_effective_window_ordered"]),
    ({"kind": "standing", "frequency": "daily"}, ["duty_frequency_matches_kind"]),
    ({"frequency": None}, ["duty_frequency_matches_kind"]),
    ({"frequency": "fortnightly"}, ["duty_frequency_valid"]),
    ({"state": "deleted"}, ["duty_state_valid"]),
    ({"kind": "oneoff"}, ["duty_kind_valid"]),
    ({"title": ""}, ["duty_title_length"]),
    ({"title": "x" * 501}, ["duty_title_length"]),
])
def test_invalid_duties_are_refused_with_an_error_naming_the_problem(engine, overrides, names):
    with pytest.raises(IntegrityError) as refused:
        add_duty(engine, **overrides)
    for name in names:
        assert name in str(refused.value)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM duty")).scalar_one() == 0


def test_every_iana_zone_both_sides_know_is_accepted(engine):
    for zone in ("Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu", "Pacific/Chatham", "UTC"):
        add_duty(engine, timezone=zone)


def test_a_tenant_sees_and_writes_only_its_own_workspace(database_url, engine):
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    my_duty = add_duty(engine, workspace_id=mine, title="mine")
    their_duty = add_duty(engine, workspace_id=theirs, title="theirs")
    ensure_partitions(engine, ["2026-08"])
    with engine.begin() as conn:
        conn.execute(insert(task), [
            {"duty_id": d, "workspace_id": w, "period_key": "2026-08", "period_start": date(2026, 8, 1),
             "due_date": date(2026, 8, 31), "visible_from": date(2026, 8, 31)}
            for d, w in ((my_duty, mine), (their_duty, theirs))])

    with tenant(database_url, mine) as conn:
        assert conn.execute("SELECT title FROM duty").fetchall() == [("mine",)]
        assert conn.execute("SELECT duty_id FROM task").fetchall() == [(my_duty,)]
        assert conn.execute("UPDATE task SET status = 'done' WHERE duty_id = %s", (their_duty,)).rowcount == 0
        assert conn.execute("DELETE FROM duty WHERE id = %s", (their_duty,)).rowcount == 0
        conn.execute("UPDATE task SET status = 'done', updated_at = now() WHERE duty_id = %s", (my_duty,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute(
                "INSERT INTO duty (workspace_id, title, kind, frequency, timezone) "
                "VALUES (%s, 'intruder', 'recurring', 'daily', 'UTC')", (theirs,))
        # A duty never changes workspace: the column is not the tenant's to write.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table duty"):
            conn.execute("UPDATE duty SET workspace_id = %s WHERE id = %s", (theirs, my_duty))
        conn.execute("RESET rota.workspace_id")
        assert conn.execute("SELECT count(*) FROM duty").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM task").fetchone() == (0,)

    with tenant(database_url, None) as conn:
        assert conn.execute("SELECT count(*) FROM duty").fetchone() == (0,)

    with engine.connect() as conn:
        assert conn.execute(text("SELECT status FROM task WHERE duty_id = :d"), {"d": their_duty}).scalar_one() == "open"
        assert conn.execute(text("SELECT count(*) FROM duty")).scalar_one() == 2


def test_row_level_security_is_enabled_and_forced(engine):
    with engine.connect() as conn:
        flags = conn.execute(text(
            "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
            "WHERE relname IN ('duty', 'task', 'event', 'job_queue') ORDER BY relname")).all()
    assert flags == [(name, True, True) for name in ("duty", "event", "job_queue", "task")]


def _task_row(duty_id, workspace_id, key="2026-08"):
    month = int(key[-2:])
    return {"duty_id": duty_id, "workspace_id": workspace_id, "period_key": key,
            "period_start": date(2026, month, 1), "due_date": date(2026, month, 28),
            "visible_from": date(2026, month, 28)}


def test_a_task_must_name_an_existing_duty_of_its_own_workspace(engine, workspace):
    duty_id = add_duty(engine, workspace_id=workspace)
    ensure_partitions(engine, ["2026-07", "2026-08"])
    for bad in (_task_row(duty_id + 1000, workspace), _task_row(duty_id, uuid.uuid4())):
        # One bad row refuses the whole statement, good rows included.
        with pytest.raises(IntegrityError, match=rf"task_duty_fkey|duty {bad['duty_id']} of workspace"):
            with engine.begin() as conn:
                conn.execute(insert(task), [_task_row(duty_id, workspace, "2026-07"), bad])
    with engine.begin() as conn:
        conn.execute(insert(task), [_task_row(duty_id, workspace)])
        assert conn.execute(text("SELECT count(*) FROM task")).scalar_one() == 1
    with pytest.raises(IntegrityError, match=f"duty {duty_id + 1000} of workspace"):
        with engine.begin() as conn:
            conn.execute(text("UPDATE task SET duty_id = duty_id + 1000"))
    other = add_duty(engine, workspace_id=workspace)
    with engine.begin() as conn:  # moving a task to another duty of its workspace is allowed
        conn.execute(text("UPDATE task SET duty_id = :d"), {"d": other})


def test_every_unvouched_task_is_checked_by_copy_and_straight_into_a_partition(engine, workspace):
    """The check is a row trigger, which PostgreSQL clones onto every partition (migration
    0013): an orphan COPYed into task, or inserted into a partition by name, is refused
    like one inserted through task. And task has no insert trigger with a transition
    table, which would make COPY insert one row at a time."""
    duty_id = add_duty(engine, workspace_id=workspace)
    ensure_partitions(engine, ["2026-08"])
    orphan = (duty_id + 1000, "2026-08", workspace, date(2026, 8, 1), date(2026, 8, 31), date(2026, 8, 31))
    with pytest.raises(IntegrityError, match=f"duty {duty_id + 1000} of workspace"):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO task_2026_08_a (id, duty_id, period_key, workspace_id, period_start, "
                              "due_date, visible_from) VALUES (424242, :d, :k, :w, :s, :e, :v)"),
                         dict(zip("dkwsev", orphan)))
    with engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"duty {duty_id + 1000} of workspace"):
            with cursor.copy("COPY task (duty_id, period_key, workspace_id, period_start, due_date, visible_from) "
                             "FROM STDIN") as copy:
                copy.write_row(orphan)
        conn.connection.driver_connection.rollback()  # the COPY went around SQLAlchemy's transaction
        assert conn.execute(text("SELECT count(*) FROM task")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM pg_trigger "
                                 "WHERE tgrelid = 'task'::regclass AND tgnewtable IS NOT NULL")).scalar_one() == 0


def test_only_the_transaction_that_vouches_for_its_duties_skips_the_check(database_url, engine, workspace):
    """A dispatch page vouches for its rows by setting rota.task_duties_held to its own
    transaction id (migration 0012). Any other value, a session-wide one left on a pooled
    connection, or another transaction's id, leaves every row checked; and a tenant may not
    insert a task at all, vouched or not."""
    duty_id = add_duty(engine, workspace_id=workspace)
    ensure_partitions(engine, ["2026-08"])
    orphan = _task_row(duty_id + 1000, workspace)
    with engine.connect() as conn:
        earlier = conn.execute(text("SELECT CAST(pg_current_xact_id() AS text)")).scalar_one()
        conn.commit()
        for value, local in ((earlier, True), ("on", True), ("true", False), (earlier, False)):
            conn.execute(text("SELECT set_config('rota.task_duties_held', :v, :local)"), {"v": value, "local": local})
            with pytest.raises(IntegrityError, match=f"duty {duty_id + 1000} of workspace"):
                conn.execute(insert(task), [orphan])
            conn.rollback()
        conn.execute(text("RESET rota.task_duties_held"))
    with tenant(database_url, workspace) as conn:
        conn.execute("SELECT set_config('rota.task_duties_held', CAST(pg_current_xact_id() AS text), true)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO task (duty_id, period_key, workspace_id, period_start, due_date, visible_from) "
                         "VALUES (%s, '2026-08', %s, '2026-08-01', '2026-08-31', '2026-08-31')", (duty_id, workspace))


def test_a_duty_with_tasks_cannot_be_deleted_moved_or_truncated_alone(database_url, engine, workspace):
    duty_id = add_duty(engine, workspace_id=workspace)
    spare = add_duty(engine, workspace_id=workspace)
    ensure_partitions(engine, ["2026-08"])
    with engine.begin() as conn:
        conn.execute(insert(task), [_task_row(duty_id, workspace)])
    for statement in (f"DELETE FROM duty WHERE id IN ({duty_id}, {spare})",
                      f"UPDATE duty SET workspace_id = gen_random_uuid() WHERE id = {duty_id}",
                      "TRUNCATE duty"):
        with pytest.raises(IntegrityError, match=f"task_duty_fkey|duty {duty_id} still has tasks|truncated"):
            with engine.begin() as conn:
                conn.execute(text(statement))
    with pytest.raises(ProgrammingError, match='column "id" can only be updated to DEFAULT'):  # GENERATED ALWAYS
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE duty SET id = id + 1000 WHERE id = {duty_id}"))
    with tenant(database_url, workspace) as conn:
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"duty {duty_id} still has tasks"):
            conn.execute("DELETE FROM duty WHERE id = %s", (duty_id,))
        assert conn.execute("DELETE FROM duty WHERE id = %s", (spare,)).rowcount == 1
    with engine.begin() as conn:
        conn.execute(text("UPDATE duty SET title = 'renamed', workspace_id = workspace_id"))
        conn.execute(text("TRUNCATE task, duty"))
