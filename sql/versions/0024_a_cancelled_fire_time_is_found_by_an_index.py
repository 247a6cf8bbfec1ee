"""job_queue_unscheduled_idx: the runs a schedule cancelled, found without reading the rest

Producers queued a run its schedule cancelled again through their insert's ON CONFLICT
DO UPDATE. DO UPDATE locks the existing row it meets, so a producer that lost a race
to another locked each run the winner had just queued, one by one, and racing producers
took 1.6 times as long. The producers now ask this index whether any of their jobs has
such a run (almost never) and queue those again in a statement of their own, before an
insert that is back to DO NOTHING.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX job_queue_unscheduled_idx ON public.job_queue (job_id, scheduled_for) "
               "WHERE unscheduled_at IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP INDEX public.job_queue_unscheduled_idx")
