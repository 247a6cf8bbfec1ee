"""The queue over months: event delivery by ledger, source cursors that survive a failed poll

- `event.dispatched_at`: when the event sensor queued the event's runs. The sensor takes
  every event without one, whenever its transaction committed, so delivery no longer
  depends on how long the producing transaction stayed open (the id cursor and its
  ten-minute look-back at `recorded_at` missed an event committed later than that).
  `recorded_at` and its index go. Events already in the table are left undelivered:
  the first pass queues what no run exists for yet (job_queue_event_identity makes the
  rest a no-op) and marks them all.
- A tenant inserts an event's workspace, type, payload and occurrence only: it cannot
  insert one marked as dispatched.
- `source_cursor`: where a Source's poll of one scope (a GitHub repository) got to,
  written in the same transaction as the runs that poll produced. A poll that fails for
  one repository keeps every other repository's progress, and a failed tick can say so.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("event", sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("event_dispatch_pending_idx", "event", ["dispatched_at", "id"])
    op.drop_index("event_recorded_at_idx", table_name="event")
    op.drop_column("event", "recorded_at")
    op.execute("REVOKE INSERT ON event FROM rota_app")
    op.execute("GRANT INSERT (workspace_id, type, payload, occurred_at) ON event TO rota_app")
    op.create_table(
        "source_cursor",
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("cursor", JSONB, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("source", "scope", name="source_cursor_pkey"),
    )


def downgrade() -> None:
    op.drop_table("source_cursor")
    op.execute("REVOKE INSERT ON event FROM rota_app")
    op.execute("GRANT INSERT ON event TO rota_app")
    op.add_column("event", sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False,
                                     server_default=sa.func.now()))
    op.create_index("event_recorded_at_idx", "event", ["recorded_at"])
    op.drop_index("event_dispatch_pending_idx", table_name="event")
    op.drop_column("event", "dispatched_at")
