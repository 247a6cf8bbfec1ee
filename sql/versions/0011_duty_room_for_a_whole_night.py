"""duty: room on each page for every row's next version at once

Migration 0003 left a fifth of each page free, room for the few duties one ordinary
night moves. The first dispatch, a month's first night or a backfill moves nearly every
duty on a page in one statement: at fillfactor 80 most of those updates found no room
and wrote a new entry into each of duty's indexes (measured at 300,000 duties: 21 us and
790 bytes of WAL a row, against 10 us and 380 bytes with room for all). Half a page
free holds the new version of every row on it. New and moved rows get the room at once;
rows already packed get it as they are updated or when the table is rewritten
(`VACUUM FULL duty`, in a maintenance window).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE duty SET (fillfactor = 50)")


def downgrade() -> None:
    op.execute("ALTER TABLE duty SET (fillfactor = 80)")
