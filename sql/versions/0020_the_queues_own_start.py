"""rota_history.installed_at: where the queue's and maintenance's partitions begin

`rota history-start` moves where the task assets' partitions begin, so an operator can
backfill tasks from before the install. The queue's fire times and the nightly
maintenance had nothing before the install to do: moving their partitions with it made
hundreds of hours and nights look owed. They now begin at the install, which nothing
moves. A database whose history start was moved before this revision recorded no install:
it is estimated as migration 0015 estimated the start, from the oldest duty or job,
never before the start itself.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE rota_history ADD COLUMN installed_at timestamptz")
    op.execute("""
        UPDATE rota_history
        SET installed_at = greatest(started_at, least((SELECT min(created_at) FROM duty),
                                                      (SELECT min(created_at) FROM job)))
    """)
    op.execute("ALTER TABLE rota_history ALTER COLUMN installed_at SET NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE rota_history DROP COLUMN installed_at")
