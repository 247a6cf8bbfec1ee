"""Tenant isolation attacked from a tenant session, and secrets kept out of everything a
user can read (issue 6, cases 8 and 9)."""

import uuid
from datetime import date, datetime, timezone

import psycopg
import pytest
from dagster import DagsterInstance, build_sensor_context, materialize
from sqlalchemy import insert, make_url, text

from rota.pipelines.definitions import defs
from rota.pipelines.dispatch.writing import ensure_partitions
from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from rota.pipelines.queue.enqueue import enqueue_scheduled
from rota.pipelines.queue.jobs import register_job
from rota.resources.database.schema import task
from rota.resources.database.server import with_database
from rota.resources.github import github_from_env
from tests.fake_github import FakeGitHub
from tests.helpers import add_duty, database_fingerprint, rows_only, tenant

T0 = datetime(2026, 8, 31, 20, 0, tzinfo=timezone.utc)


def _world(engine):
    """Rows of two workspaces and system rows, in every tenant table."""
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    duties = {w: add_duty(engine, workspace_id=w, title=f"duty of {w}") for w in (mine, theirs)}
    ensure_partitions(engine, ["2026-08"])
    with engine.begin() as conn:
        conn.execute(insert(task), [
            {"duty_id": d, "workspace_id": w, "period_key": "2026-08", "period_start": date(2026, 8, 1),
             "due_date": date(2026, 8, 31), "visible_from": date(2026, 8, 31)} for w, d in duties.items()])
        for w in (mine, theirs, None):
            conn.execute(text("INSERT INTO event (workspace_id, type) VALUES (:w, 'ping')"), {"w": w})
    for w, name in ((mine, "mine"), (theirs, "theirs"), (None, "system")):
        enqueue_scheduled(engine, register_job(engine, name, schedule="* * * * *", workspace_id=w), T0)
    return mine, theirs, duties


TABLES = ("duty", "task", "event", "job_queue", "job")
# The one table a tenant may update and delete rows of (SPEC §2): on the others such a
# write is refused by privilege before row-level security is asked.
WRITABLE = "duty"


def test_a_tenant_cannot_read_write_move_or_delete_outside_its_workspace(database_url, engine):
    mine, theirs, duties = _world(engine)
    before = database_fingerprint(engine)
    with tenant(database_url, mine) as conn:
        for table in TABLES:
            seen = conn.execute(f"SELECT DISTINCT workspace_id FROM {table}").fetchall()
            assert seen == [(mine,)], (table, seen)
            if table != WRITABLE:
                for statement in (f"UPDATE {table} SET workspace_id = %(mine)s", f"DELETE FROM {table}"):
                    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied for table {table}"):
                        conn.execute(statement, {"mine": mine})
                continue
            # Another workspace's rows and system rows: no update or delete reaches them.
            for where in ("workspace_id <> %(mine)s", "workspace_id IS NULL"):
                assert conn.execute(f"UPDATE {table} SET title = 'taken' WHERE {where}",
                                    {"mine": mine}).rowcount == 0, table
                assert conn.execute(f"DELETE FROM {table} WHERE {where}", {"mine": mine}).rowcount == 0, table
            # Its own rows cannot be moved into another workspace or made system rows: the
            # column is not the tenant's to write at all.
            for target in (theirs, None):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied for table {table}"):
                    conn.execute(f"UPDATE {table} SET workspace_id = %s", (target,))
        for target in (theirs, None):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                conn.execute("INSERT INTO duty (workspace_id, title, kind, frequency, timezone) "
                             "VALUES (%s, 'intruder', 'recurring', 'daily', 'UTC')", (target,))
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                conn.execute("INSERT INTO event (workspace_id, type) VALUES (%s, 'forged')", (target,))
        # Tasks are the dispatcher's alone, in any workspace.
        for target in (theirs, mine, None):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table task"):
                conn.execute("INSERT INTO task (duty_id, workspace_id, period_key, period_start, due_date, "
                             "visible_from) VALUES (%s, %s, '2026-09', '2026-09-01', '2026-09-30', '2026-09-30')",
                             (duties[theirs], target))
        assert conn.execute("SELECT name FROM job").fetchall() == [("mine",)]
    # Nothing of the attempts above left a trace in the rows.
    assert rows_only(database_fingerprint(engine)) == rows_only(before)


@pytest.mark.parametrize("trick", [
    "RESET rota.workspace_id",
    "SET rota.workspace_id = ''",
    "SELECT set_config('rota.workspace_id', '', false)",
    "SET rota.workspace_id TO DEFAULT",
    "RESET ALL",
    "DISCARD ALL",
])
def test_clearing_the_workspace_fails_closed(database_url, engine, trick):
    mine, _, _ = _world(engine)
    with tenant(database_url, mine) as conn:
        conn.execute(trick)
        for table in TABLES:
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), (trick, table)
        assert conn.execute(f"UPDATE {WRITABLE} SET title = title").rowcount == 0
        assert conn.execute(f"DELETE FROM {WRITABLE}").rowcount == 0
        assert conn.execute("UPDATE task SET status = 'done'").rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO event (workspace_id, type) VALUES (NULL, 'forged')")


@pytest.mark.parametrize("trick, error", [
    ("SET ROLE {owner}", psycopg.errors.InsufficientPrivilege),
    ("SET SESSION AUTHORIZATION {owner}", psycopg.errors.InsufficientPrivilege),
    ("SET row_security = off", None),
    ("SELECT set_config('rota.workspace_id', 'not-a-uuid', false)", None),
    ("ALTER TABLE duty DISABLE ROW LEVEL SECURITY", psycopg.errors.InsufficientPrivilege),
    ("ALTER TABLE task DISABLE TRIGGER ALL", psycopg.errors.InsufficientPrivilege),
    ("CREATE POLICY open ON duty USING (true)", psycopg.errors.InsufficientPrivilege),
    ("GRANT rota_app TO CURRENT_USER", psycopg.errors.InsufficientPrivilege),
])
def test_role_and_setting_tricks_fail_closed(database_url, engine, trick, error):
    mine, _, _ = _world(engine)
    owner = make_url(database_url).username
    with tenant(database_url, mine) as conn:
        if error is not None:
            with pytest.raises(error):
                conn.execute(trick.format(owner=owner))
            assert conn.execute("SELECT count(*) FROM duty").fetchone() == (1,)
            return
        conn.execute(trick.format(owner=owner))
        # The setting took; reading now either fails outright or sees nothing.
        for table in TABLES:
            try:
                count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            except psycopg.Error:
                continue
            assert count == 0 or trick.startswith("SET row_security"), (trick, table, count)
            assert count <= 1  # never another workspace's row


def _github_sensor_ticks(monkeypatch) -> str:
    """Sensor ticks as the daemon runs them, with the token from the environment: one
    that succeeds, one that meets an outage, and one whose error body echoes the token."""
    told = []
    with FakeGitHub() as github:
        github.add_issues("octo/cat", 3)
        monkeypatch.setenv("ROTA_GITHUB_API_URL", github.url)
        monkeypatch.setenv("ROTA_GITHUB_REPOSITORIES", "octo/cat")
        sensor = defs.resolve_sensor_def("github_issues_sensor")
        for script in ([], [{"status": 503}] * 4, [{"status": 401, "body": f"bad credentials {SECRET_TOKEN}"}] * 4):
            github.script += script
            try:
                resources = {**defs.resources, "github": github_from_env()}  # as a fresh process builds it
                with build_sensor_context(definitions=defs, resources=resources,
                                          instance=DagsterInstance.ephemeral()) as context:
                    told.append(repr(sensor.evaluate_tick(context)))
            except Exception as error:  # noqa: BLE001 - what a failing tick shows is the point
                told.append(f"{error!r} {error}")
        assert github.requests, told
        assert github.requests[0]["authorization"] == f"Bearer {SECRET_TOKEN}"  # the token was used
    return "\n".join(told)


SECRET_PASSWORD = "s3cret-Pa55-" + uuid.uuid4().hex[:8]
SECRET_TOKEN = "ghp_" + uuid.uuid4().hex


def test_secrets_never_reach_logs_metadata_or_run_records(database_url, engine, test_server, monkeypatch, tmp_path,
                                                         caplog):
    """The database password and the GitHub token are given to rota the way production
    gives them (environment variables), then every run record, event, log line and
    metadata value Dagster stores is searched for them."""
    admin = test_server.require_admin("creating a BYPASSRLS role with a password")
    role = f"rota_secret_{uuid.uuid4().hex[:8]}"  # roles are cluster-wide: never reuse one
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN BYPASSRLS PASSWORD '{SECRET_PASSWORD}'")
    with engine.begin() as conn:
        conn.execute(text(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"))
        conn.execute(text(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}"))
    url = make_url(database_url).set(username=role, password=SECRET_PASSWORD)
    monkeypatch.setenv("ROTA_DATABASE_URL", url.render_as_string(hide_password=False))
    monkeypatch.setenv("ROTA_GITHUB_TOKEN", SECRET_TOKEN)
    add_duty(engine)
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))
    try:
        ok = materialize([defs.resolve_assets_def("monthly_tasks")], instance=instance,
                         tags={PARTITION_RANGE_START_TAG: "2026-08-01", PARTITION_RANGE_END_TAG: "2026-08-01"},
                         run_config={"ops": {"monthly_tasks": {"config": {"as_of": "2026-08-20T00:00:00Z"}}}})
        assert ok.success
        # A run that fails on the database: its error must not quote the connection string.
        monkeypatch.setenv("ROTA_DATABASE_URL", url.set(port=1).render_as_string(hide_password=False))
        failed = materialize([defs.resolve_assets_def("monthly_tasks")], instance=instance,
                             raise_on_error=False,
                             tags={PARTITION_RANGE_START_TAG: "2026-08-01",
                                   PARTITION_RANGE_END_TAG: "2026-08-01"})
        assert not failed.success
        monkeypatch.setenv("ROTA_DATABASE_URL", url.render_as_string(hide_password=False))
        stored = [_github_sensor_ticks(monkeypatch)]
        for record in instance.get_run_records():
            stored.append(repr(record.dagster_run))
            for entry in instance.all_logs(record.dagster_run.run_id):
                stored.append(repr(entry))
        stored.append("\n".join(r.getMessage() + repr(r.args) for r in caplog.records))
        for path in tmp_path.rglob("*"):
            if path.is_file():
                stored.append(path.read_bytes().decode("utf-8", "replace"))
        everything = "\n".join(stored)
        assert "monthly_tasks" in everything and len(everything) > 10_000  # the search had material
        assert SECRET_PASSWORD not in everything
        assert SECRET_TOKEN not in everything
    finally:
        instance.dispose()
        with psycopg.connect(with_database(admin, make_url(database_url).database), autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
