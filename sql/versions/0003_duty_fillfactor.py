"""duty: leave room on each page so the dispatcher's update is a HOT update

Every scheduled run that creates a task moves its duty's last_dispatched_period. The
column is in no index, so with free space on the page PostgreSQL updates the row in
place (heap-only tuple) instead of writing a new entry into each of duty's indexes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE duty SET (fillfactor = 80)")


def downgrade() -> None:
    op.execute("ALTER TABLE duty RESET (fillfactor)")
