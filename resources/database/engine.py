"""The engine every rota process opens on its database, without Dagster: `rota worker`
and the producers import this alone."""

from sqlalchemy import Engine, create_engine, make_url

from rota.resources.database.migrate import require_head, require_pipeline_role
from rota.resources.database.server import driver_url

# The pool a Dagster run's engine keeps: a dispatch takes one pooled connection to read and
# one per page it writes at once.
POOL_SIZE, POOL_OVERFLOW = 4, 4
MAX_DISPATCH_WRITERS = POOL_SIZE + POOL_OVERFLOW - 1
DEFAULT_WRITERS = 3


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
