"""The engine every rota process opens on its database, without Dagster: `rota worker`
and the producers import this alone."""

from sqlalchemy import Engine, create_engine, make_url

from pipelines.migrations import require_head, require_pipeline_role
from resources.server import driver_url


def make_engine(url: str, **pool) -> Engine:
    """An engine on rota's database whose schema is at the migrations' head, as a role that
    sees every workspace.

    psycopg prepares no statement on the server (`prepare_threshold=None`): behind
    PgBouncer in transaction mode consecutive transactions may land on different server
    connections, where a prepared name is either missing or already taken."""
    engine = create_engine(driver_url(url), pool_pre_ping=True, connect_args={"prepare_threshold": None}, **pool)
    where = make_url(url).render_as_string(hide_password=True)
    try:
        with engine.connect() as connection:
            require_pipeline_role(connection, where)
            require_head(connection, where)
    except BaseException:
        engine.dispose()
        raise
    return engine
