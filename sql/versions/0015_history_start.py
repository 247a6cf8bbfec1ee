"""rota_history: when this database's rota history starts, recorded by the first migration

Every process reads the same fact from the database, so a fresh install shows no
partition from before it existed and nothing needs an environment setting to agree:
the code server and every run worker build their partitions from it, and an operator
moves it earlier with `rota history-start DATE` to backfill further back.

A database migrated before this revision starts at the earliest duty or job it holds.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE rota_history (
            one_row boolean NOT NULL DEFAULT true,
            started_at timestamptz NOT NULL,
            CONSTRAINT rota_history_pkey PRIMARY KEY (one_row),
            CONSTRAINT rota_history_one_row CHECK (one_row)
        )
    """)
    op.execute("""
        INSERT INTO rota_history (started_at)
        SELECT least(now(), (SELECT min(created_at) FROM duty), (SELECT min(created_at) FROM job))
    """)


def downgrade() -> None:
    op.execute("DROP TABLE rota_history")
