"""Test fixtures: a real PostgreSQL (ROTA_DATABASE_URL's server, or the embedded one under
.rota/test), one migrated template database, and a fresh copy of it per test.

The suite runs in a non-UTC process TZ and a non-UTC session TimeZone unless told
otherwise: time-zone bugs are invisible in UTC."""

import os
import time

os.environ.setdefault("TZ", "Pacific/Chatham")
os.environ.setdefault("PGTZ", "America/St_Johns")
time.tzset()

import itertools  # noqa: E402
import uuid  # noqa: E402

import psycopg  # noqa: E402
import pytest  # noqa: E402
from psycopg import sql  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402

from pipelines import migrations  # noqa: E402
from resources.server import (  # noqa: E402
    ROTA_HOME_DEFAULT,
    driver_url,
    libpq_url,
    start_embedded,
    stop_embedded,
    with_database,
)

TEMPLATE = f"rota_test_template_{os.getpid()}"
_counter = itertools.count()


@pytest.fixture(scope="session")
def server_url():
    """A libpq URL of the test server's maintenance database."""
    configured = os.environ.get("ROTA_DATABASE_URL")
    if configured:
        yield with_database(libpq_url(configured), "postgres")
        return
    datadir = ROTA_HOME_DEFAULT / "test" / "pgdata"
    datadir.parent.mkdir(parents=True, exist_ok=True)
    yield start_embedded(datadir, database="postgres")
    stop_embedded(datadir)


def _admin(server_url):
    return psycopg.connect(server_url, autocommit=True)


@pytest.fixture(scope="session")
def template_url(server_url):
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    url = with_database(server_url, TEMPLATE)
    migrations.upgrade(url)
    yield url
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE)))


@pytest.fixture
def fresh_database(server_url, template_url):
    """Make a fresh migrated database; returns a factory so a test can have several."""
    made = []

    def make() -> str:
        name = f"rota_test_{os.getpid()}_{next(_counter)}"
        with _admin(server_url) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(TEMPLATE)
                )
            )
        made.append(name)
        return with_database(server_url, name)

    yield make
    with _admin(server_url) as conn:
        for name in made:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


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
