"""Alembic environment for rota. The target URL comes from `resources.database.migrate`."""

from alembic import context
from sqlalchemy import create_engine

from resources.database.schema import metadata

config = context.config


def run_migrations_online() -> None:
    engine = create_engine(config.attributes["url"])
    with engine.connect() as connection:
        # Serialise concurrent `rota migrate` calls against one database.
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('rota migrate'))")
        # task's partitions are made by rota as periods arrive (migration 0009), not declared.
        partitions = set(connection.exec_driver_sql(
            "SELECT relname FROM pg_class WHERE relispartition AND relnamespace = 'public'::regnamespace").scalars())
        context.configure(connection=connection, target_metadata=metadata, compare_type=True,
                          include_name=lambda name, type_, _: not (type_ == "table" and name in partitions))
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("rota migrations run online only: use `rota migrate`")
run_migrations_online()
