-- The sources' statements (pipelines/sources): their cursors and the nightly maintenance.
-- Loaded by name (rota.resources.database.queries); SQLAlchemy `text()` parameters.

-- name: cursors
SELECT scope, cursor FROM source_cursor WHERE source = :source;

-- name: save_cursor
INSERT INTO source_cursor (source, scope, cursor) VALUES (:source, :scope, :cursor)
ON CONFLICT ON CONSTRAINT source_cursor_pkey DO UPDATE SET cursor = EXCLUDED.cursor, updated_at = now()
WHERE source_cursor.cursor IS DISTINCT FROM EXCLUDED.cursor;

-- name: compact
-- A finished run past the retention keeps its row, and with it its identity (schedule,
-- event or source ref): only the payload and the error text go. Deleting the row would let
-- a backfill or a replayed cursor produce the same run again.
WITH done AS (
    SELECT id FROM job_queue
    WHERE state IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(days => :days)
      AND (payload <> '{}'::jsonb OR last_error IS NOT NULL)
    ORDER BY id
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
)
UPDATE job_queue q SET payload = '{}'::jsonb, last_error = NULL
FROM done WHERE q.id = done.id;

-- name: analyze
-- Fresh statistics for the tables whose sizes change night by night.
ANALYZE duty, task, job, event, job_queue;
