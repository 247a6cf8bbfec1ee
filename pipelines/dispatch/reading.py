"""Reading the duties a run may have work for, a keyset page at a time.

A scheduled run reads only the duties that may still lack a task of a period it could
emit (read_page_scheduled in queries.sql); a backfill reads every dispatchable duty of the frequency."""

from datetime import datetime

from sqlalchemy import Engine

from rota.pipelines.dispatch.planner import DutyRow
from rota.pipelines.periods.calendar import calendar_units, local_dates
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.dispatch")
# At one instant a zone's today is one of at most three dates (UTC-12 to UTC+14): the
# queries' z.today has a WHEN for each.
TODAYS = 3


def local_today(instant: datetime) -> dict:
    """The parameters of the queries' z.today: each duty's local date at `instant` by the
    planner's calendar (NULL for a zone Python does not know)."""
    days = local_dates(instant)
    if len(days) > TODAYS:
        raise AssertionError(f"{len(days)} local dates at {instant.isoformat()}; the queries hold {TODAYS}")
    params = {}
    for n in range(TODAYS):
        day, zones = days[n] if n < len(days) else (None, "")
        params.update({f"zones_{n}": zones, f"day_{n}": day})
    return params


def read_pages(engine: Engine, frequency: str, page_size: int, scheduled_at: datetime | None = None):
    """Yield the dispatchable duties of one frequency, a keyset page at a time. With
    `scheduled_at`, only those a scheduled run at that instant may still have work for."""
    if scheduled_at is None:
        query, params = QUERIES["read_page"], {}
    else:
        query, params = QUERIES["read_page_scheduled"], {**local_today(scheduled_at), **calendar_units(frequency)}
    params.update(frequency=frequency, page_size=page_size)
    after = 0
    while True:
        with engine.connect() as conn:
            # Binary results: a million rows' ints and dates decode in half the time of text.
            cursor = conn.connection.driver_connection.cursor(binary=True)
            rows = cursor.execute(query, {**params, "after": after}).fetchall()
            conn.rollback()
        if rows:
            yield [DutyRow._make(row) for row in rows]
        if len(rows) < page_size:
            return
        after = rows[-1][0]
