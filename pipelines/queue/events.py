"""Event dispatch: each committed event enqueues one run for every enabled job of its type."""

from sqlalchemy import Connection, Engine, text

from rota.pipelines.queue.transaction import transaction
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.queue")


_DISPATCH_PENDING = text(QUERIES["dispatch_pending"])


def dispatch_pending_events(conn: Connection | Engine, *, limit: int = 10_000) -> tuple[int, int]:
    """Deliver every committed event not delivered yet, `limit` at a time; returns
    (events delivered, runs created). Each event is delivered once, whenever its
    transaction committed; a pass with nothing pending writes nothing."""
    delivered = created = 0
    while True:
        with transaction(conn) as c:
            events, runs = c.execute(_DISPATCH_PENDING, {"limit": limit}).one()
        delivered, created = delivered + events, created + runs
        if events < limit:
            return delivered, created
