"""duty and task: recurring duties and the tasks dispatched from them

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

import zoneinfo

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID


revision = "0001"
down_revision = None
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


def _timestamps() -> list[sa.Column]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    ]


def upgrade() -> None:
    op.create_table("iana_timezone", sa.Column("name", sa.Text, primary_key=True))
    op.execute(
        sa.text(
            "INSERT INTO iana_timezone (name) "
            "SELECT name FROM pg_timezone_names WHERE name = ANY(:names) ORDER BY name"
        ).bindparams(names=sorted(zoneinfo.available_timezones()))
    )

    op.create_table(
        "duty",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("workspace_id", UUID(as_uuid=True), nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("frequency", sa.Text, nullable=True),
        sa.Column("timezone", sa.Text, nullable=False),
        sa.Column("lead_days", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("effective_from", sa.Date, nullable=True),
        sa.Column("effective_to", sa.Date, nullable=True),
        sa.Column("state", sa.Text, nullable=False, server_default=sa.text("'active'")),
        sa.Column("last_dispatched_period", sa.Text, nullable=True),
        *_timestamps(),
        sa.CheckConstraint("kind IN ('recurring', 'standing')", name="duty_kind_valid"),
        sa.CheckConstraint(
            "frequency IN ('daily', 'weekly', 'monthly', 'quarterly', 'yearly')",
            name="duty_frequency_valid",
        ),
        sa.CheckConstraint("(kind = 'standing') = (frequency IS NULL)", name="duty_frequency_matches_kind"),
        sa.CheckConstraint("state IN ('active', 'paused', 'archived')", name="duty_state_valid"),
        sa.CheckConstraint("lead_days BETWEEN 0 AND 366", name="duty_lead_days_range"),
        sa.CheckConstraint(
            "effective_from IS NULL OR effective_to IS NULL OR effective_from <= effective_to",
            name="duty_effective_window_ordered",
        ),
        sa.CheckConstraint("char_length(title) BETWEEN 1 AND 500", name="duty_title_length"),
        sa.ForeignKeyConstraint(["timezone"], ["iana_timezone.name"], name="duty_timezone_known"),
        sa.UniqueConstraint("id", "workspace_id", name="duty_id_workspace_key"),
    )
    op.create_index("duty_dispatch_scan_idx", "duty", ["frequency", "id"])

    op.create_table(
        "task",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("duty_id", sa.BigInteger, nullable=False),
        sa.Column("workspace_id", UUID(as_uuid=True), nullable=False),
        sa.Column("period_key", sa.Text, nullable=False),
        sa.Column("period_start", sa.Date, nullable=False),
        sa.Column("due_date", sa.Date, nullable=False),
        sa.Column("visible_from", sa.Date, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'open'")),
        *_timestamps(),
        sa.UniqueConstraint("duty_id", "period_key", name="task_dispatch_identity"),
        sa.CheckConstraint("status IN ('open', 'done', 'skipped')", name="task_status_valid"),
        sa.CheckConstraint(
            "period_start <= due_date AND visible_from <= due_date", name="task_period_ordered"
        ),
        sa.ForeignKeyConstraint(
            ["duty_id", "workspace_id"], ["duty.id", "duty.workspace_id"], name="task_duty_fkey"
        ),
    )

    # Roles are cluster-wide: another database on the same server, or the DBA, may have
    # made it. Looked up first, so a migrator without CREATEROLE can use a DBA's rota_app.
    op.execute(
        """
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'rota_app') THEN
                CREATE ROLE rota_app LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
            END IF;
        EXCEPTION WHEN duplicate_object THEN NULL;
        END $$
        """
    )
    op.execute("GRANT USAGE ON SCHEMA public TO rota_app")
    op.execute("GRANT SELECT ON iana_timezone TO rota_app")
    for table in ("duty", "task"):
        enable_tenant_isolation(table)


def downgrade() -> None:
    op.drop_table("task")
    op.drop_table("duty")
    op.drop_table("iana_timezone")
