"""Check constraints get the names the code uses; job_queue.source_ref gets a length

Migrations 0001 and 0002 spelled out full names (`duty_lead_days_range`), and Alembic
applied the metadata's naming convention on top (`duty_duty_lead_days_range`). The
doubled names are renamed to the ones `resources/database/schema.py` gives; new names are marked
final with `op.f`.

A source reference is bounded to 1..1000 characters: unbounded, an oversized one failed
on the identity index's entry size limit with an error naming only the index.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

RENAMED = {
    "duty": ["effective_window_ordered", "frequency_matches_kind", "frequency_valid", "kind_valid",
             "lead_days_range", "state_valid", "title_length"],
    "task": ["period_ordered", "status_valid"],
    "job": ["max_attempts_range", "name_length", "schedule_cron_shape"],
    "job_queue": ["attempts_non_negative", "lease_matches_state", "one_origin", "source_has_ref", "state_valid"],
}


def upgrade() -> None:
    for table, names in RENAMED.items():
        for name in names:
            op.execute(f"ALTER TABLE {table} RENAME CONSTRAINT {table}_{table}_{name} TO {table}_{name}")
    op.create_check_constraint(op.f("job_queue_source_ref_length"), "job_queue",
                               "char_length(source_ref) BETWEEN 1 AND 1000")


def downgrade() -> None:
    op.drop_constraint(op.f("job_queue_source_ref_length"), "job_queue", type_="check")
    for table, names in RENAMED.items():
        for name in names:
            op.execute(f"ALTER TABLE {table} RENAME CONSTRAINT {table}_{name} TO {table}_{table}_{name}")
