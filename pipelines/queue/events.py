"""Event dispatch: each committed event enqueues one run for every enabled job of its type."""

from sqlalchemy import Connection, Engine, text

from rota.pipelines.queue.transaction import transaction


# Events not yet delivered, oldest first, each taken by one sensor (SKIP LOCKED), queued
# and marked in one statement. An event becomes visible when its transaction commits,
# however long that took, and is delivered by the first pass after that.
_DISPATCH_PENDING = text(
    """
    WITH pending AS MATERIALIZED (
        SELECT id FROM event WHERE dispatched_at IS NULL ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED
    ),
    queued AS (
        INSERT INTO job_queue (job_id, workspace_id, event_id, run_at, payload)
        SELECT j.id, coalesce(e.workspace_id, j.workspace_id), e.id, now(), e.payload
        FROM pending p
        JOIN event e ON e.id = p.id
        JOIN job j ON j.event_type = e.type AND j.enabled
                  AND (j.workspace_id IS NULL OR j.workspace_id = e.workspace_id)
        WHERE NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.event_id = e.id AND q.job_id = j.id)
        ORDER BY e.id, j.id
        ON CONFLICT ON CONSTRAINT job_queue_event_identity DO NOTHING
        RETURNING id
    ),
    marked AS (
        UPDATE event e SET dispatched_at = now() FROM pending p WHERE e.id = p.id RETURNING e.id
    )
    SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM queued)
    """
)


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
