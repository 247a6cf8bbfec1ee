from functools import lru_cache

from dagster import ConfigurableResource, EnvVar
from pydantic import Field
from sqlalchemy import Engine

from rota.resources.database.engine import (
    DEFAULT_WRITERS,
    MAX_DISPATCH_WRITERS,
    POOL_OVERFLOW,
    POOL_SIZE,
    make_engine,
)
from rota.resources.settings import read_environment


@lru_cache(maxsize=None)
def engine_for(url: str) -> Engine:
    """One pooled engine per URL and process, so runs and sensors reuse warm connections."""
    return make_engine(url, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)


class PostgresResource(ConfigurableResource):
    """rota's own database. `database_url` is a plain libpq URL (set from ROTA_DATABASE_URL)."""

    database_url: str
    # Pages a dispatch writes at once, each on its own connection: fewer leave more of a
    # busy server to its other sessions.
    dispatch_writers: int = Field(default=DEFAULT_WRITERS, ge=1, le=MAX_DISPATCH_WRITERS,
                                  description="connections a dispatch writes on at once",
                                  json_schema_extra={"env": "ROTA_DISPATCH_WRITERS"})

    def engine(self) -> Engine:
        return engine_for(self.database_url)


def postgres_from_env() -> PostgresResource:
    return PostgresResource(database_url=EnvVar("ROTA_DATABASE_URL"), **read_environment(PostgresResource))
