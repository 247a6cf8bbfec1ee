-- The schedules' and sensors' statements (schedules/). Loaded by name
-- (rota.resources.database.queries); SQLAlchemy `text()` parameters.

-- name: jobs_fingerprint
SELECT coalesce(md5(string_agg(concat_ws('|', id, schedule, timezone, enabled), ',' ORDER BY id)), '') FROM job WHERE schedule IS NOT NULL;
