"""Alembic environment for rota. The target URL, and for a drift check the tables to compare
with, come from `resources.database.migrate`: nothing here imports rota's code."""

from alembic import context
from sqlalchemy import MetaData, create_engine

# The names the migrations' constraints and indexes were created under (alembic's ops take
# them from the target metadata): frozen here, as the migrations are. `schema.py` uses the
# same convention, and the drift check passes its tables in.
NAMING_CONVENTION = {
    "ix": "%(table_name)s_%(column_0_N_name)s_idx",
    "uq": "%(table_name)s_%(column_0_N_name)s_key",
    "ck": "%(table_name)s_%(constraint_name)s",
    "fk": "%(table_name)s_%(column_0_name)s_fkey",
    "pk": "%(table_name)s_pkey",
}

config = context.config


def run_migrations_online() -> None:
    engine = create_engine(config.attributes["url"])
    with engine.connect() as connection:
        # Serialise concurrent `rota migrate` calls against one database.
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('rota migrate'))")
        # task's partitions are made by rota as periods arrive (migration 0009), not declared.
        partitions = set(connection.exec_driver_sql(
            "SELECT relname FROM pg_class WHERE relispartition AND relnamespace = 'public'::regnamespace").scalars())
        target_metadata = config.attributes.get("metadata") or MetaData(naming_convention=NAMING_CONVENTION)
        context.configure(connection=connection, target_metadata=target_metadata, compare_type=True,
                          include_name=lambda name, type_, _: not (type_ == "table" and name in partitions))
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("rota migrations run online only: use `rota migrate`")
run_migrations_online()
