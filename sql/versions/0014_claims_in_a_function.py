"""job_queue_complete_and_claim(): a worker's record-and-claim, planned once per session

A worker records the runs it finished and claims its next ones in one call. Sent as
text, those statements (data-modifying CTEs and joins) were planned at every call:
about 0.4 ms of the 0.9 ms a one-run claim took, on the path from a run falling due to
its handler starting. rota prepares no statement on the server, so that PgBouncer in
transaction mode can carry its connections; a PL/pgSQL function's plans are cached by
the server session that runs it instead, whichever client the pooler lends it to.

SECURITY INVOKER: it reads and writes what its caller may (row-level security applies
as before). Only the owner and its members may call it; tenants have no use for it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE FUNCTION job_queue_complete_and_claim(
            finished_ids bigint[], worker_id text, claim_limit integer, lease_seconds double precision)
        RETURNS TABLE (recorded bigint[], id bigint, job_id bigint, job_name text, workspace_id uuid,
                       attempts integer, max_attempts integer, payload jsonb, scheduled_for timestamptz,
                       event_id bigint, source text, source_ref text)
        LANGUAGE plpgsql AS $$
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
    """)
    op.execute("REVOKE EXECUTE ON FUNCTION job_queue_complete_and_claim(bigint[], text, integer, double precision) "
               "FROM PUBLIC")


def downgrade() -> None:
    op.execute("DROP FUNCTION job_queue_complete_and_claim(bigint[], text, integer, double precision)")
