"""The job queue operated from Dagster (SPEC §6): when each attempt started, and what an
operator did to a run

- `job_queue.started_at`: when the run's latest attempt was claimed, set by the claim
  itself, so the time from falling due (`run_at`) to starting is known per attempt.
- `job_queue.operator_action` ('retried' or 'cancelled'), `operator_action_at` and
  `operator_run_id` (the Dagster run that did it): an operator's latest action on the run,
  on the row itself. Tenants hold no grant to write job_queue, so only the pipelines'
  role records them.

The claim function is replaced whole (frozen here as it now stands), its fixed
search_path kept.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_SIGNATURE = "public.job_queue_complete_and_claim(bigint[], text, integer, double precision)"

_CLAIM_WITH_START = """
        CREATE OR REPLACE FUNCTION public.job_queue_complete_and_claim(
            finished_ids bigint[], worker_id text, claim_limit integer, lease_seconds double precision)
        RETURNS TABLE (recorded bigint[], id bigint, job_id bigint, job_name text, workspace_id uuid,
                       attempts integer, max_attempts integer, payload jsonb, scheduled_for timestamptz,
                       event_id bigint, source text, source_ref text)
        LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
        #variable_conflict use_column
        DECLARE
            recorded_ids bigint[];
        BEGIN
            -- The finished runs first, in a statement of their own. A claim's FOR UPDATE
            -- SKIP LOCKED may lock a row in passing: the newest version of a run another
            -- worker claimed after the claim's snapshot, which then fails the recheck
            -- but stays locked until that claim commits. A worker recording a finished
            -- run may wait for such a lock; it must do so while its own claim holds
            -- none, or two workers can each wait for the other (deadlock detected).
            --
            -- A finished run is found by its id alone. It must still be this worker's:
            -- a lease owner is set exactly while a run is running (the constraint
            -- job_queue_lease_matches_state), so no `state = 'running'` is asked, which
            -- the planner could answer from job_queue_claim_idx's 'running' range (a walk
            -- over every run in progress and their dead versions) whenever its statistics
            -- say few runs are running.
            WITH finished AS (
                UPDATE job_queue q
                SET state = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
                    updated_at = now()
                FROM unnest(finished_ids) AS f (id)
                WHERE q.id = f.id AND q.lease_owner = worker_id
                RETURNING q.id
            )
            SELECT array_agg(id) INTO recorded_ids FROM finished;
            -- A run whose job was disabled after it was queued is cancelled, not handed
            -- out. The one-row join returns the finished ids even when nothing is claimed.
            RETURN QUERY
            WITH due AS (
                SELECT q.id
                FROM job_queue q
                WHERE q.state = 'queued' AND q.run_at <= now()
                ORDER BY q.run_at
                LIMIT claim_limit
                FOR UPDATE SKIP LOCKED
            ),
            claimed AS (
                UPDATE job_queue q
                SET state = CASE WHEN j.enabled THEN 'running' ELSE 'cancelled' END,
                    attempts = q.attempts + CASE WHEN j.enabled THEN 1 ELSE 0 END,
                    lease_owner = CASE WHEN j.enabled THEN worker_id END,
                    lease_expires_at = CASE WHEN j.enabled THEN now() + make_interval(secs => lease_seconds) END,
                    started_at = CASE WHEN j.enabled THEN now() ELSE q.started_at END,
                    finished_at = CASE WHEN j.enabled THEN NULL ELSE now() END,
                    last_error = CASE WHEN j.enabled THEN q.last_error
                                 ELSE 'cancelled: job ' || j.name || ' was disabled after this run was queued' END,
                    updated_at = now()
                FROM due, job j
                WHERE q.id = due.id AND j.id = q.job_id
                RETURNING q.id, q.job_id, j.name, q.workspace_id, q.attempts, j.max_attempts, q.payload,
                          q.scheduled_for, q.event_id, q.source, q.source_ref, j.enabled
            )
            SELECT recorded_ids, c.id, c.job_id, c.name, c.workspace_id, c.attempts,
                   c.max_attempts, c.payload, c.scheduled_for, c.event_id, c.source, c.source_ref
            FROM (VALUES (1)) AS one (n) LEFT JOIN claimed c ON c.enabled
            ORDER BY c.id;
        END
        $$
"""

_STARTED = "                    started_at = CASE WHEN j.enabled THEN now() ELSE q.started_at END,\n"
_CLAIM_WITHOUT_START = _CLAIM_WITH_START.replace(_STARTED, "")


def upgrade() -> None:
    op.execute("ALTER TABLE public.job_queue ADD COLUMN started_at timestamptz, "
               "ADD COLUMN operator_action text, ADD COLUMN operator_action_at timestamptz, "
               "ADD COLUMN operator_run_id text, "
               "ADD CONSTRAINT job_queue_operator_action_valid "
               "CHECK (operator_action IN ('retried', 'cancelled')), "
               "ADD CONSTRAINT job_queue_operator_action_recorded "
               "CHECK ((operator_action IS NULL) = (operator_action_at IS NULL) "
               "AND (operator_action IS NULL) = (operator_run_id IS NULL))")
    op.execute(_CLAIM_WITH_START)
    op.execute(f"REVOKE EXECUTE ON FUNCTION {_SIGNATURE} FROM PUBLIC")


def downgrade() -> None:
    op.execute(_CLAIM_WITHOUT_START)
    op.execute("ALTER TABLE public.job_queue DROP COLUMN operator_run_id, DROP COLUMN operator_action_at, "
               "DROP COLUMN operator_action, DROP COLUMN started_at")
