"""job, event and job_queue: runs with an identity per origin

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID


revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


# Frozen here: a later policy is a later migration, never an edit of this one.
_CURRENT_WORKSPACE = "NULLIF(current_setting('rota.workspace_id', true), '')::uuid"


def enable_tenant_isolation(table: str) -> None:
    op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY {table}_workspace_isolation ON {table} "
        f"USING (workspace_id = {_CURRENT_WORKSPACE}) "
        f"WITH CHECK (workspace_id = {_CURRENT_WORKSPACE})"
    )
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO rota_app")

CRON_SHAPE = r"^\s*[0-9A-Za-z*/,?#-]+(\s+[0-9A-Za-z*/,?#-]+){4}\s*$"

IDENTITY_COMMENT = (
    "One of three complementary identities of job_queue (schedule, event, source): every "
    "run has exactly one origin (job_queue_one_origin) and NULLs are distinct, so each "
    "constraint binds only runs of its own origin. Producing is an insert whose conflict "
    "here is an expected outcome."
)


def _timestamps() -> list[sa.Column]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    ]


def upgrade() -> None:
    op.create_table(
        "job",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("workspace_id", UUID(as_uuid=True), nullable=True),
        sa.Column("schedule", sa.Text, nullable=True),
        sa.Column("timezone", sa.Text, nullable=False, server_default=sa.text("'UTC'")),
        sa.Column("event_type", sa.Text, nullable=True),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default=sa.text("5")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("name", name="job_name_key"),
        sa.CheckConstraint(f"schedule ~ '{CRON_SHAPE}'", name="job_schedule_cron_shape"),
        sa.CheckConstraint("max_attempts BETWEEN 1 AND 100", name="job_max_attempts_range"),
        sa.CheckConstraint("char_length(name) BETWEEN 1 AND 200", name="job_name_length"),
        sa.ForeignKeyConstraint(["timezone"], ["iana_timezone.name"], name="job_timezone_known"),
    )
    op.create_table(
        "event",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("workspace_id", UUID(as_uuid=True), nullable=True),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("payload", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("event_recorded_at_idx", "event", ["recorded_at"])
    op.create_table(
        "job_queue",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job_id", sa.BigInteger, sa.ForeignKey("job.id", name="job_queue_job_id_fkey"), nullable=False),
        sa.Column("workspace_id", UUID(as_uuid=True), nullable=True),
        sa.Column("event_id", sa.BigInteger, sa.ForeignKey("event.id", name="job_queue_event_id_fkey"), nullable=True),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True),
        sa.Column("source", sa.Text, nullable=True),
        sa.Column("source_ref", sa.Text, nullable=True),
        sa.Column("state", sa.Text, nullable=False, server_default=sa.text("'queued'")),
        sa.Column("run_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("lease_owner", sa.Text, nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("payload", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("last_error", sa.Text, nullable=True),
        *_timestamps(),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("job_id", "scheduled_for", name="job_queue_schedule_identity"),
        sa.UniqueConstraint("event_id", "job_id", name="job_queue_event_identity"),
        sa.UniqueConstraint("source", "source_ref", name="job_queue_source_identity"),
        sa.CheckConstraint("num_nonnulls(scheduled_for, event_id, source_ref) = 1", name="job_queue_one_origin"),
        sa.CheckConstraint("(source IS NULL) = (source_ref IS NULL)", name="job_queue_source_has_ref"),
        sa.CheckConstraint(
            "state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name="job_queue_state_valid"
        ),
        sa.CheckConstraint(
            "(state = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name="job_queue_lease_matches_state",
        ),
        sa.CheckConstraint("attempts >= 0", name="job_queue_attempts_non_negative"),
    )
    op.create_index("job_queue_claim_idx", "job_queue", ["state", "run_at"])
    for constraint in ("job_queue_schedule_identity", "job_queue_event_identity", "job_queue_source_identity"):
        op.execute(f"COMMENT ON CONSTRAINT {constraint} ON job_queue IS '{IDENTITY_COMMENT}'")
    for table in ("event", "job_queue"):
        enable_tenant_isolation(table)


def downgrade() -> None:
    op.drop_table("job_queue")
    op.drop_table("event")
    op.drop_table("job")
