"""Starts rota cannot make right are refused with one line naming what to do, and exit 2,
on a PostgreSQL cluster of their own that no harness prepared: a database the role may
not create, a `rota_app` the migrator may not create, a role that row-level security
binds, and the tenants' role used for rota's own processes."""

import os
import subprocess
import sys

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import make_url

from rota.resources.database.server import start_embedded, stop_embedded, with_database

# What each refusal must say: the attribute or statement that fixes it.
BYPASSRLS_FIX = "have a DBA run ALTER ROLE rota_plain BYPASSRLS"


@pytest.fixture
def cluster(tmp_path):
    """A new embedded cluster with no rota role or database; yields its superuser URL."""
    datadir = tmp_path / "pgdata"
    admin = start_embedded(datadir, database="postgres")
    try:
        yield admin
    finally:
        stop_embedded(datadir)


def _role(admin: str, name: str, attributes: str, database: str | None = None) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} " + attributes).format(sql.Identifier(name)))
        if database:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(name)))
    return make_url(with_database(admin, database or "postgres")).set(username=name).render_as_string(
        hide_password=False)


def _rota(tmp_path, url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ROTA_HISTORY_START"}
    env.update(ROTA_DATABASE_URL=url, ROTA_HOME=str(tmp_path / "home"))
    return subprocess.run([sys.executable, "-m", "rota.pipelines.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _refused(done: subprocess.CompletedProcess, *phrases: str) -> None:
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "Traceback" not in said and len(done.stdout.strip().splitlines()) == 1, said
    for phrase in phrases:
        assert phrase in said, said


def test_a_missing_database_the_role_may_not_create(cluster, tmp_path):
    url = with_database(_role(cluster, "rota_owner", "LOGIN BYPASSRLS"), "rota")
    _refused(_rota(tmp_path, url, "migrate"), "the database rota does not exist",
             "have a DBA run CREATE DATABASE rota OWNER rota_owner")


def test_a_missing_rota_app_the_migrator_may_not_create(cluster, tmp_path):
    url = _role(cluster, "rota_owner", "LOGIN BYPASSRLS", database="rota")
    _refused(_rota(tmp_path, url, "migrate"), "the role rota_app does not exist",
             "CREATE ROLE rota_app LOGIN PASSWORD")
    with psycopg.connect(url) as conn:  # refused before anything was written
        assert conn.execute("SELECT to_regclass('duty')").fetchone()[0] is None


@pytest.fixture
def migrated(cluster):
    """rota migrated by its owner, the way docs/deploy.md's DBA hands it over."""
    owner = _role(cluster, "rota_owner", "LOGIN BYPASSRLS", database="rota")
    _role(cluster, "rota_app", "LOGIN")
    from rota.resources.database import migrate as migrations

    migrations.upgrade(owner)
    return cluster, owner


def test_a_role_without_bypassrls_is_refused_by_every_process_that_dispatches_or_checks(migrated, tmp_path):
    cluster, owner = migrated
    with psycopg.connect(cluster, autocommit=True) as conn:
        conn.execute("CREATE ROLE rota_plain LOGIN IN ROLE rota_owner")  # the owner's rights, not its attribute
    plain = make_url(owner).set(username="rota_plain").render_as_string(hide_password=False)
    _refused(_rota(tmp_path, plain, "migrate"), "lacks BYPASSRLS", BYPASSRLS_FIX)
    _refused(_rota(tmp_path, plain, "worker"), "lacks BYPASSRLS", BYPASSRLS_FIX)
    _refused(_rota(tmp_path, plain, "dev", "--port", "0"), "lacks BYPASSRLS", BYPASSRLS_FIX)
    # The code location (every run and sensor loads it) does not load.
    env = {k: v for k, v in os.environ.items() if k != "ROTA_HISTORY_START"}
    loaded = subprocess.run([sys.executable, "-c", "import pipelines.definitions"], capture_output=True, text=True,
                            env={**env, "ROTA_DATABASE_URL": plain}, timeout=120)
    assert loaded.returncode != 0 and BYPASSRLS_FIX in loaded.stderr, loaded.stderr[-2000:]
    # A run given such a resource fails before it dispatches anything.
    from rota.resources.database.server import Refused
    from rota.resources.postgres import PostgresResource

    with pytest.raises(Refused, match="lacks BYPASSRLS"):
        PostgresResource(database_url=plain).engine()


def test_the_tenants_role_is_refused_for_rotas_own_processes(migrated, tmp_path):
    _, owner = migrated
    tenant = make_url(owner).set(username="rota_app").render_as_string(hide_password=False)
    for command in (["migrate"], ["worker"], ["history-start"]):
        _refused(_rota(tmp_path, tenant, *command), "connects as rota_app, the tenants' role")


def test_a_connection_refused_for_another_reason_is_named_and_nothing_is_created(cluster, tmp_path):
    """Only a missing database sends rota to the `postgres` database; a role the server
    does not know is refused as the server put it."""
    url = make_url(with_database(cluster, "rota")).set(username="nobody").render_as_string(hide_password=False)
    _refused(_rota(tmp_path, url, "migrate"), "cannot connect to", 'role "nobody" does not exist')
    with psycopg.connect(cluster) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = 'rota'").fetchone() is None
