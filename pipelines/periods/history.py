"""Where rota's history starts: one fact in the database (`rota_history`, written by the
first `rota migrate`), read by every process that builds partitions, so none of them
needs a setting to agree with the others. Beside it, the install, which nothing moves.

Nothing before it was ever dispatched or delivered: a partition there would only show as
missing. An operator who wants to backfill further back moves it earlier with
`rota history-start DATE` and reloads the code location."""

import os
from datetime import datetime, timezone
from functools import lru_cache

from sqlalchemy import Connection, text
from sqlalchemy.pool import NullPool

from rota.resources.database.queries import queries
from rota.resources.database.server import Refused, resolve_database_url

QUERIES = queries("rota.pipelines.periods")

# Overrides the database's fact for a process that must not read it: the test suite, whose
# modules build their partitions before any test database exists.
OVERRIDE = "ROTA_HISTORY_START"


def parse_history_start(value: str, name: str = OVERRIDE) -> datetime:
    """A date (`2026-12-03`) or instant (`2026-12-03T09:00`, UTC unless it has an offset)."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"{name} must be a UTC date or instant like 2026-12-03 or 2026-12-03T09:00, "
                         f"not {value!r}") from None
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)


def read_history_start(connection: Connection) -> datetime:
    return connection.execute(text(QUERIES["history_start"])).scalar_one().astimezone(timezone.utc)


def move_history_start(connection: Connection, start: datetime) -> None:
    connection.execute(text(QUERIES["move_history_start"]), {"start": start})


def history_start() -> datetime:
    """This process's history start: where the task assets' partitions begin."""
    return _history()[0]


def installed_at() -> datetime:
    """This process's install instant: where the queue's and nightly maintenance's partitions
    begin. Nothing was queued or maintained before it, whatever the history start."""
    return _history()[1]


@lru_cache(maxsize=1)
def _history() -> tuple[datetime, datetime]:
    """Read once from rota's database (ROTA_DATABASE_URL, or the running embedded server),
    through the same checks every rota process makes."""
    override = os.environ.get(OVERRIDE)
    if override:
        return parse_history_start(override), parse_history_start(override)
    from rota.resources.database.engine import make_engine

    try:
        url = resolve_database_url(start=False)
    except RuntimeError as missing:
        raise Refused(f"rota's definitions need its database to know where its history starts: {missing}") from None
    engine = make_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return (read_history_start(connection),
                    connection.execute(text(QUERIES["installed_at"])).scalar_one().astimezone(timezone.utc))
    finally:
        engine.dispose()
