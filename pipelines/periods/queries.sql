-- The periods' statements (pipelines/periods): where this database's rota history starts,
-- and where it was installed.
-- Loaded by name (rota.resources.database.queries); SQLAlchemy `text()` parameters.

-- name: history_start
-- rota_history holds one row, written by the migration that made it (schema.sql).
SELECT started_at FROM rota_history;

-- name: installed_at
SELECT installed_at FROM rota_history;

-- name: move_history_start
UPDATE rota_history SET started_at = :start;
