"""task_duty_fkey's triggers share one function a side

task_duty_exists_for_new_task and task_duty_exists_for_moved_task were the same check
with two messages: a task row must name a duty of its own workspace, found under the lock a
foreign key's check takes. Both triggers now call task_duty_exists, whose message names
the task by its id, which an inserted row has too. On duty's side,
task_duty_still_has_no_tasks_after_delete (a statement's transition table) and
..._after_move (a row) asked the same of a duty's old key: both triggers are row triggers
calling task_duty_has_no_tasks, which says what to do instead by what was tried.

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

_NO_TASKS = """
    DECLARE held bigint;
    BEGIN
        SELECT t.id INTO held FROM public.task t
        WHERE t.duty_id = OLD.id AND t.workspace_id = OLD.workspace_id LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'duty % still has tasks (task % and perhaps more); %', OLD.id, held,
                CASE TG_OP WHEN 'DELETE' THEN 'archive it instead of deleting it'
                           ELSE 'its id and workspace cannot change' END
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'duty';
        END IF;
        RETURN NULL;
    END"""
_DUTY_TRIGGERS = {
    "task_duty_fkey_delete": "AFTER DELETE ON public.duty FOR EACH ROW",
    "task_duty_fkey_move": "AFTER UPDATE OF id, workspace_id ON public.duty FOR EACH ROW "
                           "WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.workspace_id IS DISTINCT FROM NEW.workspace_id)",
}
# 0016's, for the downgrade: the delete's check read the statement's transition table.
_DUTY_BEFORE = {
    "task_duty_fkey_delete": ("task_duty_still_has_no_tasks_after_delete",
                              "AFTER DELETE ON public.duty REFERENCING OLD TABLE AS removed FOR EACH STATEMENT", """
    DECLARE held record;
    BEGIN
        SELECT t.duty_id, t.id AS task_id INTO held
        FROM removed r JOIN public.task t ON t.duty_id = r.id AND t.workspace_id = r.workspace_id
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'duty % still has tasks (task % and perhaps more); archive it instead of deleting it',
                held.duty_id, held.task_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'duty';
        END IF;
        RETURN NULL;
    END"""),
    "task_duty_fkey_move": ("task_duty_still_has_no_tasks_after_move", _DUTY_TRIGGERS["task_duty_fkey_move"], """
    DECLARE held bigint;
    BEGIN
        SELECT t.id INTO held FROM public.task t
        WHERE t.duty_id = OLD.id AND t.workspace_id = OLD.workspace_id LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'duty % still has tasks (task % and perhaps more); its id and workspace cannot change',
                OLD.id, held
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'duty';
        END IF;
        RETURN NULL;
    END"""),
}


def _duty_side(trigger: str, when: str, function: str, body: str) -> None:
    # SECURITY DEFINER: a tenant's delete must see every task of its duty, whatever the
    # tenant's row-level security lets it read.
    op.execute(f"CREATE OR REPLACE FUNCTION public.{function}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER "
               f"{_SEARCH_PATH} AS $${body}\n    $$")
    op.execute(f"REVOKE ALL ON FUNCTION public.{function}() FROM PUBLIC")
    op.execute(f"DROP TRIGGER {trigger} ON public.duty")
    op.execute(f"CREATE TRIGGER {trigger} {when} EXECUTE FUNCTION public.{function}()")


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
    for trigger, when in _DUTY_TRIGGERS.items():
        _duty_side(trigger, when, "task_duty_has_no_tasks", _NO_TASKS)
    for function, _, _ in _DUTY_BEFORE.values():
        op.execute(f"DROP FUNCTION public.{function}()")


def downgrade() -> None:
    for trigger, (function, when, body) in _DUTY_BEFORE.items():
        _duty_side(trigger, when, function, body)
    op.execute("DROP FUNCTION public.task_duty_has_no_tasks()")
    # Both come back with the shared body; only the new-task message named no task id.
    for function in _BEFORE.values():
        _create(function)
    _point(_BEFORE)
    op.execute("DROP FUNCTION public.task_duty_exists()")
