"""A tenant (rota_app, workspace set the documented way) attacks the integrity rules with
what PostgreSQL lets any role do: temporary tables and operators that shadow rota's, its
workspace cleared mid-statement, the dispatcher's marks, chosen ids, and relations that
squat a partition's name. Each rule holds, and the tables are as they were."""

import uuid
from datetime import date

import psycopg
import pytest
from sqlalchemy import create_engine, insert, text

from rota.pipelines.dispatch.writing import ensure_partitions
from rota.resources.database import migrate as migrations
from rota.resources.database.schema import task
from rota.resources.database.server import driver_url
from tests.helpers import add_duty, database_fingerprint, rows_only, tenant


def _dispatched_duty(engine, workspace) -> int:
    """A monthly duty of `workspace` with its task of 2026-08, as a dispatch leaves it."""
    duty_id = add_duty(engine, workspace_id=workspace, title="dispatched")
    ensure_partitions(engine, ["2026-08"])
    with engine.begin() as conn:
        conn.execute(insert(task), [{"duty_id": duty_id, "workspace_id": workspace, "period_key": "2026-08",
                                     "period_start": date(2026, 8, 1), "due_date": date(2026, 8, 31),
                                     "visible_from": date(2026, 8, 31)}])
        conn.execute(text("UPDATE duty SET last_dispatched_period = '2026-08', complete_from = '2026-08', "
                          "complete_through = '2026-08' WHERE id = :id"), {"id": duty_id})
    return duty_id


def test_temporary_tables_and_operators_named_like_rotas_shadow_nothing(database_url, engine, workspace):
    duty_id = _dispatched_duty(engine, workspace)
    before = database_fingerprint(engine)
    with tenant(database_url, workspace) as conn:
        conn.execute("CREATE TEMPORARY TABLE task (id bigint, duty_id bigint, workspace_id uuid, period_key text)")
        conn.execute("CREATE TEMPORARY TABLE duty (id bigint, workspace_id uuid)")
        conn.execute("CREATE FUNCTION pg_temp.never(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT false'")
        conn.execute("CREATE OPERATOR pg_temp.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = pg_temp.never)")
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"duty {duty_id} still has tasks"):
            conn.execute("DELETE FROM public.duty WHERE id = %s", (duty_id,))
        with pytest.raises(psycopg.errors.CheckViolation, match=f"duty {duty_id} has tasks"):
            conn.execute("UPDATE public.duty SET frequency = 'weekly' WHERE id = %s", (duty_id,))
    assert database_fingerprint(engine) == before


def test_clearing_the_workspace_mid_statement_hides_no_task_from_the_check(database_url, engine, workspace):
    duty_id = _dispatched_duty(engine, workspace)
    before = database_fingerprint(engine)
    with tenant(database_url, workspace) as conn:
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"duty {duty_id} still has tasks"):
            conn.execute("DELETE FROM duty WHERE id = %s RETURNING set_config('rota.workspace_id', '', true)",
                         (duty_id,))
        with pytest.raises(psycopg.errors.CheckViolation, match=f"duty {duty_id} has tasks"):
            conn.execute("UPDATE duty SET frequency = 'weekly' WHERE id = %s "
                         "RETURNING set_config('rota.workspace_id', %s, true)", (duty_id, str(uuid.uuid4())))
    assert database_fingerprint(engine) == before


@pytest.mark.parametrize("statement", [
    "UPDATE duty SET last_dispatched_period = '2099-12' WHERE id = %(id)s",
    "UPDATE duty SET complete_from = '2020-01', complete_through = '2099-12' WHERE id = %(id)s",
    "UPDATE duty SET created_at = now() - interval '10 years' WHERE id = %(id)s",
    "INSERT INTO duty (workspace_id, title, kind, frequency, timezone, last_dispatched_period) "
    "VALUES (%(workspace)s, 'forged', 'recurring', 'monthly', 'UTC', '2099-12')",
    "INSERT INTO duty (workspace_id, title, kind, frequency, timezone, complete_from, complete_through) "
    "VALUES (%(workspace)s, 'forged', 'recurring', 'monthly', 'UTC', '2020-01', '2099-12')",
    "INSERT INTO duty (id, workspace_id, title, kind, frequency, timezone) "
    "VALUES (%(id)s + 1, %(workspace)s, 'chosen id', 'recurring', 'monthly', 'UTC')",
    "INSERT INTO duty (id, workspace_id, title, kind, frequency, timezone) OVERRIDING SYSTEM VALUE "
    "VALUES (%(id)s + 1, %(workspace)s, 'chosen id', 'recurring', 'monthly', 'UTC')",
])
def test_a_tenant_writes_only_its_own_columns_of_a_duty(database_url, engine, workspace, statement):
    """The dispatcher's marks, ids and creation times are rota's: a tenant writing them could
    make a duty that is never dispatched, or make another tenant's next insert fail."""
    duty_id = _dispatched_duty(engine, workspace)
    before = database_fingerprint(engine)
    with tenant(database_url, workspace) as conn:
        # A chosen id meets GENERATED ALWAYS or the column grant, whichever PostgreSQL asks first.
        with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.GeneratedAlways),
                           match="permission denied for table duty|cannot insert a non-DEFAULT value into column"):
            conn.execute(statement, {"id": duty_id, "workspace": workspace})
        # What a tenant does write still works.
        conn.execute("UPDATE duty SET title = 'renamed', lead_days = 3 WHERE id = %s", (duty_id,))
        conn.execute("INSERT INTO duty (workspace_id, title, kind, frequency, timezone) "
                     "VALUES (%s, 'plain', 'recurring', 'daily', 'UTC')", (workspace,))
    after = database_fingerprint(engine)
    assert rows_only(after) != rows_only(before)  # the allowed writes landed
    with engine.connect() as conn:
        marks = conn.execute(text("SELECT last_dispatched_period, complete_from, complete_through FROM duty "
                                  "WHERE id = :id"), {"id": duty_id}).one()
    assert tuple(marks) == ("2026-08", "2026-08", "2026-08")


def test_every_id_a_role_could_write_is_generated_always(engine):
    """task's ids are written by the dispatcher alone (no tenant may insert a task)."""
    with engine.connect() as conn:
        identities = dict(conn.execute(text(
            "SELECT table_name, identity_generation FROM information_schema.columns "
            "WHERE table_schema = 'public' AND column_name = 'id' AND is_identity = 'YES' "
            "AND table_name IN ('duty', 'event', 'job', 'job_queue')")).all())
    assert identities == {name: "ALWAYS" for name in ("duty", "event", "job", "job_queue")}


def test_a_tenant_cannot_create_in_rotas_schema(database_url, workspace):
    with tenant(database_url, workspace) as conn:
        for statement in ("CREATE TABLE public.task_2031_03_a (x int)", "CREATE TABLE task_2031_03_a (x int)",
                          "CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT NULL'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema public"):
                conn.execute(statement)


def test_a_relation_squatting_a_partitions_name_is_named_not_trusted(test_server, database_url, engine):
    """Whoever did manage to create it (a role with CREATE on the schema): the dispatch says
    which relation is in the way, instead of trusting it or failing on the insert."""
    admin = test_server.require_admin("creating a relation owned by another role")
    with psycopg.connect(_as(admin, database_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE public.task_2031_03_a (x int)")
    with pytest.raises(Exception, match=r"task_2031_03_a \(a table owned by .*\) holds its name task_2031_03_a; "
                                        r"drop or rename it"):
        ensure_partitions(engine, ["2031-03"])
    ensure_partitions(engine, ["2031-04"])  # every other period is made as before


def _as(admin_url: str, database_url: str) -> str:
    from sqlalchemy import make_url

    return make_url(admin_url).set(database=make_url(database_url).database).render_as_string(hide_password=False)


def _replayed_from_empty(test_server, database_url: str, before_migrating: list[str]) -> str:
    """The database emptied, `before_migrating` run as the superuser (a DBA's set-up), then
    every migration applied as rota's role; returns the migration's refusal, or ''."""
    admin = _as(test_server.require_admin("reproducing PostgreSQL 14's grants"), database_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
        for statement in before_migrating:
            conn.execute(statement)
    try:
        migrations.upgrade(database_url)
    except Exception as refused:
        return str(refused)
    return ""


def test_postgresql_14s_create_for_everyone_is_taken_back_where_rota_owns_the_schema(test_server, database_url,
                                                                                     workspace):
    role = test_server.role
    refused = _replayed_from_empty(test_server, database_url, [
        f"ALTER SCHEMA public OWNER TO {role}", "GRANT CREATE, USAGE ON SCHEMA public TO PUBLIC"])
    assert refused == ""
    with tenant(database_url, workspace) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema public"):
            conn.execute("CREATE TABLE public.task_2031_03_a (x int)")


def test_postgresql_14s_create_for_everyone_stops_the_migration_where_rota_may_not_take_it_back(
        test_server, database_url):
    with psycopg.connect(test_server.require_admin("a schema owned by the superuser")) as conn:
        superuser = conn.info.user
    refused = _replayed_from_empty(test_server, database_url, [
        f"ALTER SCHEMA public OWNER TO {superuser}", "GRANT CREATE, USAGE ON SCHEMA public TO PUBLIC"])
    assert "have a DBA run REVOKE CREATE ON SCHEMA public FROM PUBLIC, rota_app" in refused
    engine = create_engine(driver_url(database_url))
    try:
        with engine.connect() as conn:  # refused whole: nothing half-written
            assert conn.execute(text("SELECT to_regclass('public.duty')")).scalar() is None
    finally:
        engine.dispose()
