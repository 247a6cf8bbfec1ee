"""The PostgreSQL people run: rota on databases and roles a DBA made, with the privileges
docs/deploy.md lists and no more, and no process working on a schema behind the migrations."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
from alembic import command

from rota.resources.database import migrate as migrations
from rota.resources.database.server import with_database
from tests.helpers import add_duty, task_keys
from tests.dagster.test_dagster import run_asset

ROTA = str(Path(sys.executable).parent / "rota")


def _rota(*args, url, timeout=120):
    env = {**os.environ, "ROTA_DATABASE_URL": url}
    return subprocess.run([ROTA, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_the_suite_runs_as_a_role_with_the_listed_privileges_and_no_more(test_server):
    admin = test_server.require_admin("reading another role's attributes and memberships")
    with psycopg.connect(admin) as conn:
        attributes = conn.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls, rolcanlogin "
            "FROM pg_roles WHERE rolname = %s", (test_server.role,)).fetchone()
        memberships = conn.execute(
            "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
            "JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = %s", (test_server.role,)).fetchall()
    assert attributes == (False, False, False, False, True, True)
    assert memberships == []


def test_rota_needs_no_createdb_no_createrole_and_never_the_postgres_database(test_server):
    """Databases and rota_app exist (the suite made rota_app before any migration, as the
    docs/deploy.md asks a DBA to); the postgres database refuses every connection meanwhile."""
    admin = test_server.require_admin("closing the postgres database to connections")
    name = f"rota_given_{os.getpid()}"
    url = test_server.create(name)
    test_server.create(f"{name}_dagster")
    with psycopg.connect(with_database(admin, "template1"), autocommit=True) as conn:
        conn.execute("ALTER DATABASE postgres WITH ALLOW_CONNECTIONS false")
    try:
        migrated = _rota("migrate", url=url)
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        assert "created" not in migrated.stdout
        worker = subprocess.Popen([ROTA, "worker", "--poll", "0.05"], env={**os.environ, "ROTA_DATABASE_URL": url},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert "started" in worker.stdout.readline()
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0, output
    finally:
        with psycopg.connect(with_database(admin, "template1"), autocommit=True) as conn:
            conn.execute("ALTER DATABASE postgres WITH ALLOW_CONNECTIONS true")
        for database in (name, f"{name}_dagster"):
            test_server.drop(database)


def test_no_process_works_on_a_schema_behind_head_and_each_names_rota_migrate(database_url, engine):
    add_duty(engine)
    command.downgrade(migrations.alembic_config(database_url), "0007")
    worker = _rota("worker", url=database_url)
    assert worker.returncode == 2, worker.stdout + worker.stderr
    assert f"at migration 0007, behind this rota's {migrations.head()}: run `rota migrate`" in worker.stdout
    result = run_asset("monthly_tasks", "2026-08-01", "2026-08-01", as_of="2026-08-20T00:00:00Z",
                       raise_on_error=False)
    assert not result.success
    assert "run `rota migrate`" in str(result.get_step_failure_events()[0].step_failure_data.error)

    migrated = _rota("migrate", url=database_url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert run_asset("monthly_tasks", "2026-08-01", "2026-08-01", as_of="2026-08-20T00:00:00Z").success
    assert task_keys(engine) == ["2026-08"]


def test_a_schema_ahead_of_this_rota_is_refused_too(database_url, engine):
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    worker = _rota("worker", url=database_url)
    assert worker.returncode == 2
    assert "at migration 9999, which this rota does not know" in worker.stdout
