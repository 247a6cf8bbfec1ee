-- The job queue's statements (pipelines/queue): registering jobs, queueing runs, claiming
-- and finishing them, and what operators see and do. Loaded by name
-- (rota.resources.database.queries); SQLAlchemy `text()` parameters (:name), except where
-- a statement runs on a psycopg cursor (%(name)s, %b).

-- name: register_job
-- Code owns a job's shape (workspace, schedule, timezone, event type); the operator owns
-- `enabled` and `max_attempts` once the job exists (code's values only start a new job). So
-- an existing job is updated to code's shape and keeps both. An unchanged job is
-- found by the first CTE and not offered to the INSERT at all: the upsert would otherwise
-- consume an identity value (and lock the row) on every call.
WITH offered AS (
    SELECT CAST(:name AS text) AS name, CAST(:workspace_id AS uuid) AS workspace_id,
           CAST(:schedule AS text) AS schedule, CAST(:timezone AS text) AS timezone,
           CAST(:event_type AS text) AS event_type, CAST(:enabled AS boolean) AS enabled,
           CAST(:max_attempts AS integer) AS max_attempts
),
same AS (
    SELECT j.id FROM job j JOIN offered o ON j.name = o.name
    WHERE (j.workspace_id, j.schedule, j.timezone, j.event_type)
          IS NOT DISTINCT FROM (o.workspace_id, o.schedule, o.timezone, o.event_type)
),
upserted AS (
    INSERT INTO job (name, workspace_id, schedule, timezone, event_type, enabled, max_attempts)
    SELECT * FROM offered WHERE NOT EXISTS (SELECT 1 FROM same)
    ON CONFLICT ON CONSTRAINT job_name_key DO UPDATE
    SET workspace_id = EXCLUDED.workspace_id, schedule = EXCLUDED.schedule,
        timezone = EXCLUDED.timezone, event_type = EXCLUDED.event_type
    RETURNING id
)
SELECT id, false FROM same UNION ALL SELECT id, true FROM upserted;

-- name: queued_fire_times
SELECT q.id, q.scheduled_for, j.schedule, j.timezone
FROM job_queue q JOIN job j ON j.id = q.job_id
WHERE q.state = 'queued' AND q.attempts = 0 AND q.scheduled_for IS NOT NULL
  AND (CAST(:job_ids AS bigint[]) IS NULL OR q.job_id = ANY(:job_ids));

-- name: cancel_unscheduled
-- unscheduled_at marks the cancel as the schedule's: a fire time the schedule owes again
-- (the edit undone) is queued again by enqueue_scheduled and enqueue_scheduled_many, and
-- counted missing by missing_runs until then. An operator's cancel has none, and stays.
UPDATE job_queue
SET state = 'cancelled', finished_at = now(), unscheduled_at = now(), updated_at = now(),
    last_error = 'cancelled: the schedule of its job no longer fires at '
                 || to_char(scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
WHERE id = ANY(:run_ids) AND state = 'queued' AND attempts = 0
RETURNING id;

-- fragment: queue_again
-- A fire time whose run its schedule cancelled (cancel_unscheduled) and that is offered
-- again is owed again: the run is queued again, keeping its identity.
SET state = 'queued', finished_at = NULL, last_error = NULL, unscheduled_at = NULL, updated_at = now()

-- name: enqueue_scheduled
-- Returns the run and whether it was queued again rather than inserted (the workers then
-- need telling: job_queue_wakes_workers announces inserts only). Both parts read one
-- snapshot, so a run its schedule cancelled is queued again and its pair is no insert.
WITH queued_again AS (
    UPDATE job_queue
    /* fragment: queue_again */
    WHERE job_id = :job_id AND scheduled_for = :scheduled_for AND unscheduled_at IS NOT NULL
    RETURNING id
), inserted AS (
    INSERT INTO job_queue (job_id, workspace_id, scheduled_for, run_at)
    SELECT :job_id, (SELECT workspace_id FROM job WHERE id = :job_id), :scheduled_for, :scheduled_for
    WHERE NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.job_id = :job_id AND q.scheduled_for = :scheduled_for)
    ON CONFLICT ON CONSTRAINT job_queue_schedule_identity DO NOTHING
    RETURNING id
)
SELECT id, true AS queued_again FROM queued_again UNION ALL SELECT id, false FROM inserted;

-- name: find_scheduled
SELECT id FROM job_queue WHERE job_id = :job_id AND scheduled_for = :scheduled_for;

-- name: any_unscheduled
-- Whether one of these jobs has a run its schedule cancelled: almost never, and answered
-- by job_queue_unscheduled_idx with a probe per job, not per fire time.
SELECT EXISTS (SELECT FROM job_queue WHERE unscheduled_at IS NOT NULL AND job_id = ANY(%b::bigint[]));

-- name: queue_again_many
-- Before the producer inserts anything, and locked in the order every producer writes:
-- a racing producer's insert passes these runs over in its anti-join and never waits on
-- them, and two producers queueing the same runs again wait for each other in one order.
WITH offered AS (
    SELECT * FROM unnest(%b::bigint[], %b::timestamptz[]) AS o(job_id, scheduled_for)
), cancelled AS (
    SELECT q.id FROM job_queue q JOIN offered o ON q.job_id = o.job_id AND q.scheduled_for = o.scheduled_for
    WHERE q.unscheduled_at IS NOT NULL
    ORDER BY q.job_id, q.scheduled_for
    FOR UPDATE OF q
)
UPDATE job_queue
/* fragment: queue_again */
FROM cancelled c
WHERE job_queue.id = c.id
RETURNING job_queue.job_id;

-- name: enqueue_scheduled_many
-- Arrays go as binary parameters (%b): psycopg's text dumping of ten thousand
-- timestamps costs more than the insert, and racing producers pay it all at once.
WITH offered AS (
    SELECT * FROM unnest(%b::bigint[], %b::timestamptz[]) AS o(job_id, scheduled_for)
)
INSERT INTO job_queue (job_id, workspace_id, scheduled_for, run_at)
SELECT o.job_id, j.workspace_id, o.scheduled_for, o.scheduled_for
FROM offered o
-- LEFT: an unknown job must reach job_queue_job_id_fkey and fail, not vanish
LEFT JOIN job j ON j.id = o.job_id
WHERE NOT EXISTS (
    SELECT 1 FROM job_queue q WHERE q.job_id = o.job_id AND q.scheduled_for = o.scheduled_for
)
ORDER BY o.job_id, o.scheduled_for
ON CONFLICT ON CONSTRAINT job_queue_schedule_identity DO NOTHING
RETURNING job_id;

-- name: announce_queued_runs
-- What job_queue_wakes_workers says for an insert, said for runs queued again.
SELECT pg_notify('rota_runs_queued', '');

-- name: dispatch_pending
-- Events not yet delivered, oldest first, each taken by one sensor (SKIP LOCKED), queued
-- and marked in one statement. An event becomes visible when its transaction commits,
-- however long that took, and is delivered by the first pass after that.
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
SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM queued);

-- name: produce_many
-- Offered rows that would change nothing (same payload, or a run that is no longer
-- queued) are filtered out before the INSERT: ON CONFLICT DO UPDATE would otherwise lock
-- the existing row and consume an identity value even when its WHERE refuses the update.
WITH offered AS (
    SELECT * FROM unnest(:refs, :job_ids, :payloads) AS o(source_ref, job_id, payload)
)
INSERT INTO job_queue (job_id, workspace_id, source, source_ref, payload, run_at)
SELECT o.job_id, (SELECT workspace_id FROM job WHERE id = o.job_id), :source, o.source_ref,
       o.payload, now()
FROM offered o
WHERE NOT EXISTS (
    SELECT 1 FROM job_queue q
    WHERE q.source = :source AND q.source_ref = o.source_ref
      AND (q.state <> 'queued' OR q.payload = o.payload)
)
ORDER BY o.source_ref
ON CONFLICT ON CONSTRAINT job_queue_source_identity DO UPDATE
SET payload = EXCLUDED.payload, updated_at = now()
WHERE job_queue.state = 'queued' AND job_queue.payload IS DISTINCT FROM EXCLUDED.payload
RETURNING source_ref, xmax = 0 AS created;

-- name: job_ids
SELECT name, id FROM job WHERE name = ANY(:names);

-- name: complete_and_claim
-- Records a worker's finished runs and claims its next ones in one statement (migration
-- 0014's function, whose plan the server caches): one round trip and, on an autocommit
-- connection, one transaction, where a busy worker otherwise paid BEGIN, two statements
-- and COMMIT for every batch.
SELECT * FROM job_queue_complete_and_claim(
    %(finished)s::bigint[], %(worker)s::text, %(limit)s::integer, %(lease)s::double precision);

-- name: extend
UPDATE job_queue SET lease_expires_at = now() + make_interval(secs => :lease), updated_at = now()
WHERE id = ANY(:run_ids) AND state = 'running' AND lease_owner = :worker
RETURNING id;

-- name: fail
UPDATE job_queue q
SET state = CASE WHEN q.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
    run_at = CASE WHEN q.attempts >= j.max_attempts THEN q.run_at
             ELSE now() + make_interval(secs => least(:backoff * power(2, q.attempts - 1), :cap)) END,
    finished_at = CASE WHEN q.attempts >= j.max_attempts THEN now() END,
    lease_owner = NULL, lease_expires_at = NULL, last_error = :error, updated_at = now()
FROM job j
WHERE q.id = :run_id AND j.id = q.job_id AND q.state = 'running' AND q.lease_owner = :worker
RETURNING q.state;

-- name: release
UPDATE job_queue
SET state = 'queued', attempts = attempts - 1, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = now()
WHERE id = ANY(:run_ids) AND state = 'running' AND lease_owner = :worker
RETURNING id;

-- name: interrupt
UPDATE job_queue
SET lease_expires_at = now() + make_interval(secs => :expires_in), last_error = :error, updated_at = now()
WHERE id = :run_id AND state = 'running' AND lease_owner = :worker
RETURNING id;

-- name: reclaim
-- The error text outlives the session that writes it: its instant is written in UTC, not
-- in whatever TimeZone the reclaiming session has.
UPDATE job_queue q
SET state = CASE WHEN q.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
    run_at = now(),
    finished_at = CASE WHEN q.attempts >= j.max_attempts THEN now() END,
    last_error = CASE WHEN q.last_error LIKE 'interrupted: worker ' || q.lease_owner || ' %' THEN q.last_error
                      ELSE 'lease of ' || q.lease_owner || ' expired at '
                           || to_char(q.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                           || ' during attempt ' || q.attempts END,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
FROM job j
WHERE q.state = 'running' AND q.lease_expires_at < now() AND j.id = q.job_id
RETURNING q.state;

-- name: next_due
SELECT extract(epoch FROM min(run_at) - now()) FROM job_queue WHERE state = 'queued';

-- name: state
WITH recent AS (
    SELECT job_id, state, run_at, started_at, finished_at FROM job_queue WHERE state = 'queued'
    UNION ALL
    SELECT job_id, state, run_at, started_at, finished_at FROM job_queue WHERE state = 'running'
    UNION ALL
    SELECT job_id, state, run_at, started_at, finished_at FROM job_queue
    WHERE state = 'failed' AND finished_at > now() - :failed_window
    UNION ALL
    SELECT job_id, state, run_at, started_at, finished_at FROM job_queue
    WHERE state = 'succeeded' AND run_at > now() - :latency_window
)
SELECT j.name,
       count(r.*) FILTER (WHERE r.state = 'queued') AS queued,
       count(r.*) FILTER (WHERE r.state = 'queued' AND r.run_at <= now()) AS due,
       count(r.*) FILTER (WHERE r.state = 'running') AS running,
       count(r.*) FILTER (WHERE r.state = 'failed') AS failed_last_day,
       count(r.*) FILTER (WHERE r.state = 'failed' AND r.finished_at > now() - :latency_window)
           AS failed_last_hour,
       coalesce(extract(epoch FROM now() - min(r.run_at) FILTER (WHERE r.state = 'queued'
                                                                  AND r.run_at <= now())), 0)
           AS oldest_waiting_seconds,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM r.started_at - r.run_at))
           FILTER (WHERE r.started_at IS NOT NULL AND r.run_at > now() - :latency_window
                   AND r.started_at >= r.run_at)
           AS claim_latency_p95_seconds
FROM job j
LEFT JOIN recent r ON r.job_id = j.id
GROUP BY j.name
ORDER BY j.name;

-- name: failures
SELECT q.id, j.name, q.attempts, q.finished_at, q.last_error
FROM job_queue q JOIN job j ON j.id = q.job_id
WHERE q.state = 'failed' AND q.finished_at > now() - :failed_window
ORDER BY q.finished_at DESC, q.id DESC
LIMIT :shown;

-- name: lock
SELECT id, state FROM job_queue WHERE id = ANY(:ids) ORDER BY id FOR UPDATE;

-- name: retry
-- Retrying gives the run a fresh budget of its job's max_attempts; its last error stays
-- until the next attempt writes its own.
UPDATE job_queue
SET state = 'queued', run_at = now(), attempts = 0, finished_at = NULL,
    operator_action = 'retried', operator_action_at = now(), operator_run_id = :by, updated_at = now()
WHERE id = ANY(:ids) AND state = 'failed'
RETURNING id;

-- name: cancel
UPDATE job_queue
SET state = 'cancelled', finished_at = now(), last_error = 'cancelled by an operator (Dagster run ' || :by || ')',
    operator_action = 'cancelled', operator_action_at = now(), operator_run_id = :by, updated_at = now()
WHERE id = ANY(:ids) AND state = 'queued'
RETURNING id;

-- name: scheduled_jobs
SELECT id, name, schedule, timezone, scheduled_since FROM job WHERE enabled AND schedule IS NOT NULL ORDER BY id;

-- name: missing_runs
-- A run its schedule cancelled is missing when its fire time is owed again (it is queued
-- again when delivered); an operator's cancel is a decision, not a gap.
SELECT count(*) FROM unnest(:job_ids, :fire_times) AS o(job_id, scheduled_for)
WHERE NOT EXISTS (
    SELECT 1 FROM job_queue q
    WHERE q.job_id = o.job_id AND q.scheduled_for = o.scheduled_for AND q.unscheduled_at IS NULL
);

-- name: limit_statement_time
-- For the rest of the transaction only: a worker recording its finished runs on its way
-- out gives the server no longer than it has left.
SELECT set_config('statement_timeout', %(milliseconds)s, true);

-- name: listen_for_queued_runs
-- job_queue_wakes_workers (schema.sql) notifies this channel once per statement that
-- queues runs, when that statement's transaction commits.
LISTEN rota_runs_queued;
