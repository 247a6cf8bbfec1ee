"""task_duty_fkey_insert: a dispatch page's own rows are not checked a second time

The dispatcher's page statement builds every task from a duty row it holds FOR KEY SHARE
in that same statement, workspace included (pipelines/dispatch/writing.py, `_OFFERED`). That is
the foreign key's check and lock already done; the statement trigger then checked the
same 20,000 rows again, a DISTINCT over them and two probes of duty each: a quarter of
the page (108 of 476 ms, measured with EXPLAIN ANALYZE at 100,000 duties).

The page says so by setting `rota.task_duties_held` to its own transaction id for that
transaction only, and the trigger believes it for that transaction alone: a value left in
a session, set in another transaction or set to anything else checks every row as before.
Only the pipelines' role may insert tasks at all (`rota_app` has no INSERT on task, SPEC
§2), and a role that may insert tasks owns the table and could disable the trigger
outright, so the setting hands nobody a power they lacked. Every other insert, by any
role, is checked and locked exactly as migration 0007 made it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_VOUCHED = """
        -- The dispatcher's page holds these tasks' duties already (migration 0012).
        IF current_setting('rota.task_duties_held', true) = CAST(pg_current_xact_id() AS text) THEN
            RETURN NULL;
        END IF;"""

_CHECK = """
    CREATE OR REPLACE FUNCTION task_duty_exists_for_new_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE orphan record;
    DECLARE first_key text;
    BEGIN{vouched}
        -- In id order, so two inserters never wait on each other in a cycle. A duty deleted
        -- while this waited is skipped here and found missing below (a fresh snapshot).
        PERFORM 1 FROM duty d WHERE d.id IN (SELECT DISTINCT a.duty_id FROM added a)
        ORDER BY d.id FOR KEY SHARE;
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


def upgrade() -> None:
    op.execute(_CHECK.format(vouched=_VOUCHED))


def downgrade() -> None:
    op.execute(_CHECK.format(vouched=""))
