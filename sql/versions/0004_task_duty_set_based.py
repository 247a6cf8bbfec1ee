"""task -> duty integrity, checked per statement instead of per row

The composite foreign key task(duty_id, workspace_id) -> duty(id, workspace_id) ran
one referential-integrity query per inserted task: about 12 µs a row, more than the
insert itself, and two thirds of a first dispatch (benchmarks, issue 5). The same rule
now holds through triggers that check a whole statement at once:

- inserting tasks: every new (duty_id, workspace_id) must name an existing duty of that
  workspace (one anti-join over the statement's new rows);
- moving a task to another duty or workspace: the same, for that row;
- deleting duties, or moving one to another id or workspace, while tasks still name
  it: refused, as the foreign key's NO ACTION did; truncating duty alone likewise.

Errors keep the foreign key's SQLSTATE (23503) and constraint name `task_duty_fkey`,
and name the offending row. The dispatcher holds each duty it writes tasks for FOR KEY
SHARE until commit (the lock a foreign key check takes), so a concurrent delete either
goes first, and the duty offers nothing, or waits and then finds the tasks.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_FUNCTIONS = [
    """
    CREATE FUNCTION task_duty_exists_for_new_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
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
    """,
    """
    CREATE FUNCTION task_duty_exists_for_moved_task() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM duty d WHERE d.id = NEW.duty_id AND d.workspace_id = NEW.workspace_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % (period_key %) would name duty % of workspace %, which does not exist',
                NEW.id, NEW.period_key, NEW.duty_id, NEW.workspace_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'task';
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION task_duty_still_has_no_tasks_after_delete() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE held record;
    BEGIN
        SELECT t.duty_id, t.id AS task_id INTO held
        FROM removed r JOIN task t ON t.duty_id = r.id AND t.workspace_id = r.workspace_id
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'duty % still has tasks (task % and perhaps more); archive it instead of deleting it',
                held.duty_id, held.task_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'duty';
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION task_duty_still_has_no_tasks_after_move() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE held bigint;
    BEGIN
        SELECT t.id INTO held FROM task t
        WHERE t.duty_id = OLD.id AND t.workspace_id = OLD.workspace_id LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'duty % still has tasks (task % and perhaps more); its id and workspace cannot change',
                OLD.id, held
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'duty';
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION task_duty_truncated_with_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM task) THEN
            RAISE EXCEPTION 'duty was truncated while task still has rows; truncate both together'
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'duty';
        END IF;
        RETURN NULL;
    END $$
    """,
]

_TRIGGERS = [
    """CREATE TRIGGER task_duty_fkey_insert AFTER INSERT ON task
       REFERENCING NEW TABLE AS added FOR EACH STATEMENT
       EXECUTE FUNCTION task_duty_exists_for_new_tasks()""",
    """CREATE TRIGGER task_duty_fkey_update AFTER UPDATE OF duty_id, workspace_id ON task
       FOR EACH ROW WHEN (OLD.duty_id IS DISTINCT FROM NEW.duty_id OR OLD.workspace_id IS DISTINCT FROM NEW.workspace_id)
       EXECUTE FUNCTION task_duty_exists_for_moved_task()""",
    """CREATE TRIGGER task_duty_fkey_delete AFTER DELETE ON duty
       REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
       EXECUTE FUNCTION task_duty_still_has_no_tasks_after_delete()""",
    """CREATE TRIGGER task_duty_fkey_move AFTER UPDATE OF id, workspace_id ON duty
       FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.workspace_id IS DISTINCT FROM NEW.workspace_id)
       EXECUTE FUNCTION task_duty_still_has_no_tasks_after_move()""",
    """CREATE TRIGGER task_duty_fkey_truncate AFTER TRUNCATE ON duty
       FOR EACH STATEMENT EXECUTE FUNCTION task_duty_truncated_with_tasks()""",
]

_NAMES = [
    ("task", "task_duty_fkey_insert", "task_duty_exists_for_new_tasks"),
    ("task", "task_duty_fkey_update", "task_duty_exists_for_moved_task"),
    ("duty", "task_duty_fkey_delete", "task_duty_still_has_no_tasks_after_delete"),
    ("duty", "task_duty_fkey_move", "task_duty_still_has_no_tasks_after_move"),
    ("duty", "task_duty_fkey_truncate", "task_duty_truncated_with_tasks"),
]


def upgrade() -> None:
    op.execute("ALTER TABLE task DROP CONSTRAINT task_duty_fkey")
    for statement in _FUNCTIONS + _TRIGGERS:
        op.execute(statement)


def downgrade() -> None:
    for table, trigger, function in _NAMES:
        op.execute(f"DROP TRIGGER {trigger} ON {table}")
        op.execute(f"DROP FUNCTION {function}()")
    op.execute(
        "ALTER TABLE task ADD CONSTRAINT task_duty_fkey "
        "FOREIGN KEY (duty_id, workspace_id) REFERENCES duty (id, workspace_id)"
    )
