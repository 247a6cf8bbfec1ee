"""job_queue.unscheduled_at: a run its schedule stopped owing says so in a column

A fire time a cron edit cancelled is owed again if the edit is undone, and its run is then
queued again; an operator's cancel, or a disabled job's, is a decision that stays. The
runs told the two apart by their error text, which nightly compaction clears once a run is
past retention: the schedule's cancel then read as neither, its fire time was never
restored and its hour's check counted it missing for good. unscheduled_at is when the
schedule stopped firing at the run's fire time; compaction leaves it, and a run queued
again clears it. Runs already cancelled by their schedule are found by the text they
still have.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE public.job_queue ADD COLUMN unscheduled_at timestamptz, "
               "ADD CONSTRAINT job_queue_unscheduled_is_cancelled CHECK (unscheduled_at IS NULL OR state = 'cancelled')")
    op.execute("UPDATE public.job_queue SET unscheduled_at = finished_at WHERE state = 'cancelled' "
               "AND starts_with(last_error, 'cancelled: the schedule of its job no longer fires at ')")


def downgrade() -> None:
    op.execute("ALTER TABLE public.job_queue DROP COLUMN unscheduled_at")
