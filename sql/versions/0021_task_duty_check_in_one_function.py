"""task_duty_fkey's insert and update triggers share one function

task_duty_exists_for_new_task and task_duty_exists_for_moved_task were the same check
with two messages: a task row must name a duty of its own workspace, found under the lock a
foreign key's check takes. Both triggers now call task_duty_exists, whose message names
the task by its id, which an inserted row has too.

Why these are triggers and not a declarative foreign key (measured for issue 40, in
docs/perf.md): a foreign key checks every inserted row, and the dispatcher, which already
holds each duty it writes tasks for, skips this trigger (rota.task_duties_held). Inserting
3,000,000 tasks cost 10 s of server time with the skip and 26 s under a foreign key.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_SEARCH_PATH = "SET search_path = pg_catalog, public, pg_temp"
_CHECK = """
    BEGIN
        -- The lock a foreign key's check takes. A duty deleted or moved to another
        -- workspace while this waited is not found (READ COMMITTED re-reads it).
        PERFORM 1 FROM public.duty d WHERE d.id = NEW.duty_id AND d.workspace_id = NEW.workspace_id FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % (period_key %) names duty % of workspace %, which does not exist',
                NEW.id, NEW.period_key, NEW.duty_id, NEW.workspace_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'task';
        END IF;
        RETURN NULL;
    END"""
_TRIGGERS = {
    "task_duty_fkey_insert": "AFTER INSERT ON public.task FOR EACH ROW "
                             "WHEN (current_setting('rota.task_duties_held', true) "
                             "IS DISTINCT FROM CAST(pg_current_xact_id() AS text))",
    "task_duty_fkey_update": "AFTER UPDATE OF duty_id, workspace_id ON public.task FOR EACH ROW "
                             "WHEN (OLD.duty_id IS DISTINCT FROM NEW.duty_id "
                             "OR OLD.workspace_id IS DISTINCT FROM NEW.workspace_id)",
}
_BEFORE = {"task_duty_fkey_insert": "task_duty_exists_for_new_task",
           "task_duty_fkey_update": "task_duty_exists_for_moved_task"}


def _create(name: str) -> None:
    op.execute(f"CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql {_SEARCH_PATH} "
               f"AS $${_CHECK}\n    $$")
    op.execute(f"REVOKE ALL ON FUNCTION public.{name}() FROM PUBLIC")


def _point(functions: dict[str, str]) -> None:
    for trigger, function in functions.items():
        op.execute(f"DROP TRIGGER {trigger} ON public.task")
        op.execute(f"CREATE TRIGGER {trigger} {_TRIGGERS[trigger]} EXECUTE FUNCTION public.{function}()")


def upgrade() -> None:
    _create("task_duty_exists")
    _point({trigger: "task_duty_exists" for trigger in _TRIGGERS})
    for function in _BEFORE.values():
        op.execute(f"DROP FUNCTION public.{function}()")


def downgrade() -> None:
    # Both come back with the shared body; only the new-task message named no task id.
    for function in _BEFORE.values():
        _create(function)
    _point(_BEFORE)
    op.execute("DROP FUNCTION public.task_duty_exists()")
