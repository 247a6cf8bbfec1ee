"""Exactly once at the edges: a proven span instead of a watermark, a fixed frequency,
task -> duty integrity for every role, and the tenant grants of SPEC §2

- `duty.complete_from` / `complete_through`: every period of the duty whose key lies in
  that span and whose due date lies in the duty's window has a task. Only a scheduled
  dispatch sets it, after making every such period of its run; whatever could break it
  clears it (a task deleted or moved, task truncated, the window changed), so a
  scheduled run may skip a duty whose span covers all it would emit and miss nothing.
  `last_dispatched_period` stays what SPEC §2 says (the newest task's key) and no
  longer decides what a run creates: a backfill of a later period moves it past a
  current period that does not exist yet.
- A duty's frequency and kind never change once it has a task (keys of different
  frequencies are never compared). The check takes the duty FOR UPDATE first, so it
  waits out any task insert in flight, which holds the duty FOR KEY SHARE.
- Inserting tasks, or moving one to another duty, now holds the duties FOR KEY SHARE,
  as a foreign key's check does, whoever writes: a deletion of the duty in flight either goes first (the insert then
  fails) or waits and then finds the tasks (the deletion fails).
- `rota_app` may select tasks and update their status (with updated_at) only; it reads
  jobs and runs and never writes them; it inserts events but never rewrites them. Jobs
  get row-level security like the other tenant tables, so a tenant reads only its
  workspace's jobs.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op


revision = "0007"
down_revision = "0006"
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

_FUNCTIONS = [
    """
    CREATE OR REPLACE FUNCTION task_duty_exists_for_new_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE orphan record;
    DECLARE first_key text;
    BEGIN
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
    """,
    """
    CREATE OR REPLACE FUNCTION task_duty_exists_for_moved_task() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM duty d WHERE d.id = NEW.duty_id AND d.workspace_id = NEW.workspace_id FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % (period_key %) would name duty % of workspace %, which does not exist',
                NEW.id, NEW.period_key, NEW.duty_id, NEW.workspace_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'task';
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION duty_frequency_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE changed text := CASE WHEN OLD.kind IS DISTINCT FROM NEW.kind THEN 'kind' ELSE 'frequency' END;
    BEGIN
        PERFORM 1 FROM duty WHERE id = OLD.id FOR UPDATE;
        IF EXISTS (SELECT 1 FROM task WHERE duty_id = OLD.id) THEN
            RAISE EXCEPTION 'duty % has tasks, so its % cannot change (% to %): a new frequency is a new duty',
                OLD.id, changed,
                CASE changed WHEN 'kind' THEN OLD.kind ELSE OLD.frequency END,
                coalesce(CASE changed WHEN 'kind' THEN NEW.kind ELSE NEW.frequency END, 'null')
                USING ERRCODE = 'check_violation', CONSTRAINT = 'duty_frequency_fixed', TABLE = 'duty',
                      COLUMN = changed;
        END IF;
        RETURN NEW;
    END $$
    """,
    """
    CREATE FUNCTION duty_window_moved() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        NEW.complete_from := NULL;
        NEW.complete_through := NULL;
        RETURN NEW;
    END $$
    """,
    # Always a write, even when the span is already clear: a dispatch in flight compares
    # its duty's row version with the one it planned from, and must see this.
    """
    CREATE FUNCTION task_removed_clears_span() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE duty SET complete_from = NULL, complete_through = NULL
        WHERE id IN (SELECT DISTINCT duty_id FROM removed);
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION task_moved_clears_span() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE duty SET complete_from = NULL, complete_through = NULL WHERE id = OLD.duty_id;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION task_truncated_clears_spans() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE duty SET complete_from = NULL, complete_through = NULL WHERE complete_from IS NOT NULL;
        RETURN NULL;
    END $$
    """,
]

_TRIGGERS = [
    """CREATE TRIGGER duty_frequency_fixed BEFORE UPDATE OF frequency, kind ON duty
       FOR EACH ROW WHEN (OLD.frequency IS DISTINCT FROM NEW.frequency OR OLD.kind IS DISTINCT FROM NEW.kind)
       EXECUTE FUNCTION duty_frequency_fixed()""",
    """CREATE TRIGGER duty_window_moved BEFORE UPDATE OF effective_from, effective_to ON duty
       FOR EACH ROW WHEN (OLD.effective_from IS DISTINCT FROM NEW.effective_from
                          OR OLD.effective_to IS DISTINCT FROM NEW.effective_to)
       EXECUTE FUNCTION duty_window_moved()""",
    """CREATE TRIGGER task_removed_clears_span AFTER DELETE ON task
       REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
       EXECUTE FUNCTION task_removed_clears_span()""",
    """CREATE TRIGGER task_moved_clears_span AFTER UPDATE OF duty_id, period_key ON task
       FOR EACH ROW WHEN (OLD.duty_id IS DISTINCT FROM NEW.duty_id OR OLD.period_key IS DISTINCT FROM NEW.period_key)
       EXECUTE FUNCTION task_moved_clears_span()""",
    """CREATE TRIGGER task_truncated_clears_spans AFTER TRUNCATE ON task
       FOR EACH STATEMENT EXECUTE FUNCTION task_truncated_clears_spans()""",
]

_NAMES = [
    ("duty", "duty_frequency_fixed"),
    ("duty", "duty_window_moved"),
    ("task", "task_removed_clears_span"),
    ("task", "task_moved_clears_span"),
    ("task", "task_truncated_clears_spans"),
]

_GRANTS = [
    "REVOKE INSERT, UPDATE, DELETE ON task FROM rota_app",
    "GRANT UPDATE (status, updated_at) ON task TO rota_app",
    "REVOKE UPDATE, DELETE ON event FROM rota_app",
    "REVOKE INSERT, UPDATE, DELETE ON job_queue FROM rota_app",
]

_PREVIOUS_TASK_CHECK = """
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


_PREVIOUS_MOVE_CHECK = """
    CREATE OR REPLACE FUNCTION task_duty_exists_for_moved_task() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM duty d WHERE d.id = NEW.duty_id AND d.workspace_id = NEW.workspace_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % (period_key %) would name duty % of workspace %, which does not exist',
                NEW.id, NEW.period_key, NEW.duty_id, NEW.workspace_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'task';
        END IF;
        RETURN NULL;
    END $$
"""


def upgrade() -> None:
    op.add_column("duty", sa.Column("complete_from", sa.Text, nullable=True))
    op.add_column("duty", sa.Column("complete_through", sa.Text, nullable=True))
    op.create_check_constraint(op.f("duty_complete_span_whole"), "duty",
                               "(complete_from IS NULL) = (complete_through IS NULL)")
    for statement in _FUNCTIONS + _TRIGGERS + _GRANTS:
        op.execute(statement)
    enable_tenant_isolation("job")
    op.execute("REVOKE INSERT, UPDATE, DELETE ON job FROM rota_app")


def downgrade() -> None:
    op.execute("DROP POLICY job_workspace_isolation ON job")
    op.execute("ALTER TABLE job NO FORCE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE job DISABLE ROW LEVEL SECURITY")
    op.execute("REVOKE ALL ON job FROM rota_app")
    op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON task, event, job_queue TO rota_app")
    for table, name in _NAMES:
        op.execute(f"DROP TRIGGER {name} ON {table}")
        op.execute(f"DROP FUNCTION {name}()")
    op.execute(_PREVIOUS_TASK_CHECK)
    op.execute(_PREVIOUS_MOVE_CHECK)
    op.drop_constraint(op.f("duty_complete_span_whole"), "duty", type_="check")
    op.drop_column("duty", "complete_through")
    op.drop_column("duty", "complete_from")
