from functools import lru_cache

from dagster import ConfigurableResource
from sqlalchemy import Engine, create_engine

from resources.server import driver_url


@lru_cache(maxsize=None)
def engine_for(url: str) -> Engine:
    """One pooled engine per URL and process, so runs and sensors reuse warm connections."""
    return create_engine(driver_url(url), pool_pre_ping=True, pool_size=4, max_overflow=4)


class PostgresResource(ConfigurableResource):
    """rota's own database. `database_url` is a plain libpq URL (set from ROTA_DATABASE_URL)."""

    database_url: str

    def engine(self) -> Engine:
        return engine_for(self.database_url)
