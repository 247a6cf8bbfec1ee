"""Test fixtures: a real PostgreSQL (ROTA_DATABASE_URL's server, or the embedded one under
.rota/test), one migrated template database, and a fresh copy of it per test.

The suite runs in a non-UTC process TZ and a non-UTC session TimeZone unless told
otherwise: time-zone bugs are invisible in UTC."""

import os
import time

os.environ.setdefault("TZ", "Pacific/Chatham")
os.environ.setdefault("PGTZ", "America/St_Johns")
time.tzset()
# The test modules build their partitions at import, before any test database exists;
# a deployment reads the start from its database (pipelines.periods.history), which
# tests/periods/test_history.py proves without this override.
os.environ.setdefault("ROTA_HISTORY_START", "2020-01-01")

import itertools  # noqa: E402
import uuid  # noqa: E402

import psycopg  # noqa: E402
import pytest  # noqa: E402
from psycopg import sql  # noqa: E402
from sqlalchemy import create_engine, make_url  # noqa: E402

from rota.resources.database import migrate as migrations
from rota.resources.database.server import (
    driver_url,
    libpq_url,
    start_embedded,
    stop_embedded,
    with_database,
)
from tests.paths import CHECKOUT_STATE

TEMPLATE = f"rota_test_template_{os.getpid()}"
_counter = itertools.count()
# On the embedded server the suite runs as this role, made the way docs/deploy.md's "Your own
# PostgreSQL" asks a DBA to: LOGIN and BYPASSRLS, nothing more. Only the harness's own
# work (creating and dropping the test databases, one test's extra role) uses the superuser.
EMBEDDED_ROLE = "rota_owner"


class TestServer:
    """The server the suite runs on: `rota_url` as rota's role (the privileges docs/deploy.md lists
    and no more), and `admin_url`, a superuser, or None when none was given.

    `ROTA_DATABASE_URL` names rota's role and a database it may connect to; `ROTA_ADMIN_URL`
    a superuser. Without an admin the harness creates the test databases as rota's role,
    which then needs CREATEDB, and the tests that need a superuser skip, saying why."""

    def __init__(self, rota_url: str, admin_url: str | None) -> None:
        self.rota_url, self.admin_url = rota_url, admin_url
        self.role = make_url(rota_url).username

    def _connect(self):
        return psycopg.connect(self.admin_url or self.rota_url, autocommit=True)

    def url(self, name: str) -> str:
        return with_database(self.rota_url, name)

    def create(self, name: str, template: str | None = None) -> str:
        statement = sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(self.role))
        if template:
            statement += sql.SQL(" TEMPLATE {} STRATEGY FILE_COPY").format(sql.Identifier(template))
        with self._connect() as conn:
            conn.execute(statement)
        return self.url(name)

    def drop(self, name: str) -> None:
        with self._connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def require_admin(self, why: str) -> str:
        if not self.admin_url:
            pytest.skip(f"{why} needs a superuser: set ROTA_ADMIN_URL")
        return self.admin_url


def _embedded_roles(admin_url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role, attributes in ((EMBEDDED_ROLE, "LOGIN BYPASSRLS"),
                                 ("rota_app", "LOGIN NOBYPASSRLS")):
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(sql.SQL("CREATE ROLE {} " + attributes).format(sql.Identifier(role)))


@pytest.fixture(scope="session")
def test_server():
    configured = os.environ.get("ROTA_DATABASE_URL")
    if configured:
        admin = os.environ.get("ROTA_ADMIN_URL")
        yield TestServer(libpq_url(configured), libpq_url(admin) if admin else None)
        return
    datadir = CHECKOUT_STATE / "test" / "pgdata"
    datadir.parent.mkdir(parents=True, exist_ok=True)
    admin = start_embedded(datadir, database="postgres")
    _embedded_roles(admin)
    yield TestServer(make_url(admin).set(username=EMBEDDED_ROLE).render_as_string(hide_password=False), admin)
    stop_embedded(datadir)


@pytest.fixture(scope="session")
def template_url(test_server):
    test_server.drop(TEMPLATE)
    url = test_server.create(TEMPLATE)
    migrations.upgrade(url)
    yield url
    test_server.drop(TEMPLATE)


@pytest.fixture
def fresh_database(test_server, template_url):
    """Make a fresh migrated database; returns a factory so a test can have several."""
    made = []

    def make() -> str:
        name = f"rota_test_{os.getpid()}_{next(_counter)}"
        made.append(name)
        return test_server.create(name, template=TEMPLATE)

    yield make
    for name in made:
        test_server.drop(name)


@pytest.fixture
def database_url(fresh_database, monkeypatch):
    """A fresh migrated database, also exported as ROTA_DATABASE_URL for Dagster's resource."""
    url = fresh_database()
    monkeypatch.setenv("ROTA_DATABASE_URL", url)
    return url


@pytest.fixture
def engine(database_url):
    engine = create_engine(driver_url(database_url))
    yield engine
    engine.dispose()


@pytest.fixture
def workspace():
    return uuid.uuid4()
