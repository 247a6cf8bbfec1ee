"""Queued runs wake the workers: a NOTIFY per statement that queues runs

`rota worker` LISTENs on `rota_runs_queued` while it has nothing due. One notification
per statement (not per row), sent when the transaction commits: a batch of ten thousand
runs wakes each worker once, and a rolled-back enqueue wakes none. Runs that return to
the queue later (a retry's backoff, a reclaimed lease) are not announced: a worker
already sleeps only until the earliest queued run falls due, and polls besides.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE FUNCTION job_queue_announce_runs() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('rota_runs_queued', '');
            RETURN NULL;
        END
        $$
    """)
    op.execute("CREATE TRIGGER job_queue_wakes_workers AFTER INSERT ON job_queue "
               "FOR EACH STATEMENT EXECUTE FUNCTION job_queue_announce_runs()")


def downgrade() -> None:
    op.execute("DROP TRIGGER job_queue_wakes_workers ON job_queue")
    op.execute("DROP FUNCTION job_queue_announce_runs()")
