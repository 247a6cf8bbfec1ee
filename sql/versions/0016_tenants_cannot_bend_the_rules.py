"""Tenants cannot bend the integrity rules with anything PostgreSQL lets a role do

Issue 11 closed what rota's own statements reach; these close what any tenant session can
do on its own:
- Every function has a fixed search_path (pg_temp last, where it is searched for tables
  only after rota's) and names rota's tables with their schema: a temporary table called
  `task` no longer hides the tasks a check looks for. pg_temp is never searched for
  functions or operators.
- The checks a tenant's statement fires (deleting a duty, moving it, changing its
  frequency) run as the tables' owner (SECURITY DEFINER), which bypasses row-level
  security: they see every task, whatever workspace the tenant set or cleared
  mid-statement (`RETURNING set_config(...)`).
- A tenant writes only the columns that are its own: not the dispatcher's marks
  (`last_dispatched_period`, `complete_from`, `complete_through`), not `id` or
  `created_at`. Every id is GENERATED ALWAYS: no tenant picks the next one.
- Tenants may not create objects in rota's schema (PostgreSQL 14 and older grant CREATE
  on `public` to everyone), so no relation can squat a partition's name; and
  rota_ensure_task_partitions recognises a partition by pg_inherits, not by its name, and
  names the relation in the way.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

SEARCH_PATH = "SET search_path = pg_catalog, public, pg_temp"

# (name, security, body): the trigger functions, each naming rota's tables with their schema.
_FUNCTIONS = [
    ("duty_frequency_fixed", "SECURITY DEFINER", """
    DECLARE changed text := CASE WHEN OLD.kind IS DISTINCT FROM NEW.kind THEN 'kind' ELSE 'frequency' END;
    BEGIN
        PERFORM 1 FROM public.duty WHERE id = OLD.id FOR UPDATE;
        IF EXISTS (SELECT 1 FROM public.task WHERE duty_id = OLD.id) THEN
            RAISE EXCEPTION 'duty % has tasks, so its % cannot change (% to %): a new frequency is a new duty',
                OLD.id, changed,
                CASE changed WHEN 'kind' THEN OLD.kind ELSE OLD.frequency END,
                coalesce(CASE changed WHEN 'kind' THEN NEW.kind ELSE NEW.frequency END, 'null')
                USING ERRCODE = 'check_violation', CONSTRAINT = 'duty_frequency_fixed', TABLE = 'duty',
                      COLUMN = changed;
        END IF;
        RETURN NEW;
    END"""),
    ("duty_window_moved", "SECURITY INVOKER", """
    BEGIN
        NEW.complete_from := NULL;
        NEW.complete_through := NULL;
        RETURN NEW;
    END"""),
    ("task_duty_still_has_no_tasks_after_delete", "SECURITY DEFINER", """
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
    ("task_duty_still_has_no_tasks_after_move", "SECURITY DEFINER", """
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
    ("task_duty_truncated_with_tasks", "SECURITY DEFINER", """
    BEGIN
        IF EXISTS (SELECT 1 FROM public.task) THEN
            RAISE EXCEPTION 'duty was truncated while task still has rows; truncate both together'
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'duty';
        END IF;
        RETURN NULL;
    END"""),
    ("task_duty_exists_for_new_task", "SECURITY INVOKER", """
    BEGIN
        -- The lock a foreign key's check takes. A duty deleted or moved to another
        -- workspace while this waited is not found (READ COMMITTED re-reads it).
        PERFORM 1 FROM public.duty d WHERE d.id = NEW.duty_id AND d.workspace_id = NEW.workspace_id FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task (duty_id %, period_key %) names duty % of workspace %, which does not exist',
                NEW.duty_id, NEW.period_key, NEW.duty_id, NEW.workspace_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'task';
        END IF;
        RETURN NULL;
    END"""),
    ("task_duty_exists_for_moved_task", "SECURITY INVOKER", """
    BEGIN
        PERFORM 1 FROM public.duty d WHERE d.id = NEW.duty_id AND d.workspace_id = NEW.workspace_id FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % (period_key %) would name duty % of workspace %, which does not exist',
                NEW.id, NEW.period_key, NEW.duty_id, NEW.workspace_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'task';
        END IF;
        RETURN NULL;
    END"""),
    ("task_removed_clears_span", "SECURITY INVOKER", """
    BEGIN
        UPDATE public.duty SET complete_from = NULL, complete_through = NULL
        WHERE id IN (SELECT DISTINCT duty_id FROM removed);
        RETURN NULL;
    END"""),
    ("task_moved_clears_span", "SECURITY INVOKER", """
    BEGIN
        UPDATE public.duty SET complete_from = NULL, complete_through = NULL WHERE id = OLD.duty_id;
        RETURN NULL;
    END"""),
    ("task_truncated_clears_spans", "SECURITY INVOKER", """
    BEGIN
        UPDATE public.duty SET complete_from = NULL, complete_through = NULL WHERE complete_from IS NOT NULL;
        RETURN NULL;
    END"""),
    ("job_queue_announce_runs", "SECURITY INVOKER", """
    BEGIN
        PERFORM pg_notify('rota_runs_queued', '');
        RETURN NULL;
    END"""),
]

_ENSURE = r"""
CREATE OR REPLACE FUNCTION public.rota_ensure_task_partitions(period_keys text[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    wanted record;
    made integer := 0;
    squatter text;
BEGIN
    -- Whoever may insert tasks may make room for them; a tenant (rota_app) may not.
    IF NOT has_table_privilege(session_user, 'public.task', 'INSERT') THEN
        RAISE EXCEPTION 'role % may not insert tasks, so it may not make partitions of task', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    FOR wanted IN
        SELECT DISTINCT p.name, p.lower_bound, p.upper_bound
        FROM unnest(period_keys) AS k(period_key), public.rota_task_partition_of(k.period_key) AS p
        ORDER BY p.lower_bound
    LOOP
        -- A partition is a relation attached to task, whatever else carries its name.
        -- Asked again after the lock, from the catalog itself with this statement's
        -- snapshot: a partition another writer committed while this one waited is seen.
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                              WHERE i.inhparent = 'public.task'::regclass AND c.relname = wanted.name
                                AND c.relnamespace = 'public'::regnamespace);
        PERFORM pg_advisory_xact_lock(hashtext('rota task partitions'));
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                              WHERE i.inhparent = 'public.task'::regclass AND c.relname = wanted.name
                                AND c.relnamespace = 'public'::regnamespace);
        SELECT format('%s (a %s owned by %s)', c.oid::regclass,
                      CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'p' THEN 'partitioned table'
                                     ELSE 'relation' END, pg_get_userbyid(c.relowner))
        INTO squatter FROM pg_class c WHERE c.relname = wanted.name AND c.relnamespace = 'public'::regnamespace;
        IF FOUND THEN
            RAISE EXCEPTION 'the partition of task for % to % cannot be made: % holds its name %; drop or rename it',
                wanted.lower_bound, wanted.upper_bound, squatter, wanted.name
                USING ERRCODE = 'duplicate_table';
        END IF;
        EXECUTE format('CREATE TABLE public.%I (LIKE public.task INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                       wanted.name);
        EXECUTE format('ALTER TABLE public.%I ADD CONSTRAINT %I PRIMARY KEY (id, period_key), '
                       'ADD CONSTRAINT %I UNIQUE (duty_id, period_key)',
                       wanted.name, 'task_pkey_' || substr(wanted.name, 6),
                       'task_dispatch_identity_' || substr(wanted.name, 6));
        EXECUTE format('ALTER TABLE public.task ATTACH PARTITION public.%I FOR VALUES FROM (%L) TO (%L)',
                       wanted.name, wanted.lower_bound, wanted.upper_bound);
        made := made + 1;
    END LOOP;
    RETURN made;
END
$$
"""

# What a tenant may write of a duty: its own fields. Not the dispatcher's marks, the id,
# or when the row was made.
_TENANT_INSERT = ("workspace_id", "title", "kind", "frequency", "timezone", "lead_days", "effective_from",
                  "effective_to", "state", "updated_at")
_TENANT_UPDATE = ("title", "kind", "frequency", "timezone", "lead_days", "effective_from", "effective_to",
                  "state", "updated_at")
# task's ids are written by the dispatcher alone: no tenant may insert a task.
_IDENTITIES = ("duty", "job", "event", "job_queue")

# Where rota's schema is not the migrator's to change (PostgreSQL 14's `public` belongs to
# the bootstrap superuser), a DBA must take CREATE from everyone; rota says so and stops.
_NO_CREATE_FOR_TENANTS = """
DO $$
BEGIN
    IF pg_has_role(current_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'public'), 'USAGE') THEN
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
        REVOKE CREATE ON SCHEMA public FROM rota_app;
    END IF;
    IF has_schema_privilege('rota_app', 'public', 'CREATE') THEN
        RAISE EXCEPTION 'rota_app may create objects in schema public, where they could shadow or squat rota''s: '
                        'have a DBA run REVOKE CREATE ON SCHEMA public FROM PUBLIC, rota_app; then rota migrate again'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$
"""


def upgrade() -> None:
    op.execute(_NO_CREATE_FOR_TENANTS)
    for name, security, body in _FUNCTIONS:
        op.execute(f"CREATE OR REPLACE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql {security} "
                   f"{SEARCH_PATH} AS $${body}\n    $$")
        # A SECURITY DEFINER function runs as its owner: callable only as a trigger's body.
        op.execute(f"REVOKE EXECUTE ON FUNCTION public.{name}() FROM PUBLIC")
    op.execute(_ENSURE)
    op.execute("ALTER FUNCTION public.rota_task_partition_of(text) " + SEARCH_PATH)
    op.execute("ALTER FUNCTION public.job_queue_complete_and_claim(bigint[], text, integer, double precision) "
               + SEARCH_PATH)
    op.execute("REVOKE INSERT, UPDATE ON public.duty FROM rota_app")
    op.execute(f"GRANT INSERT ({', '.join(_TENANT_INSERT)}) ON public.duty TO rota_app")
    op.execute(f"GRANT UPDATE ({', '.join(_TENANT_UPDATE)}) ON public.duty TO rota_app")
    for table in _IDENTITIES:
        op.execute(f"ALTER TABLE public.{table} ALTER COLUMN id SET GENERATED ALWAYS")


def downgrade() -> None:
    for table in _IDENTITIES:
        op.execute(f"ALTER TABLE public.{table} ALTER COLUMN id SET GENERATED BY DEFAULT")
    op.execute("REVOKE INSERT, UPDATE ON public.duty FROM rota_app")
    op.execute("GRANT INSERT, UPDATE ON public.duty TO rota_app")
    op.execute("ALTER FUNCTION public.job_queue_complete_and_claim(bigint[], text, integer, double precision) "
               "RESET search_path")
    op.execute("ALTER FUNCTION public.rota_task_partition_of(text) RESET search_path")
    for name, _, _ in _FUNCTIONS:
        op.execute(f"GRANT EXECUTE ON FUNCTION public.{name}() TO PUBLIC")
        op.execute(f"ALTER FUNCTION public.{name}() SECURITY INVOKER RESET search_path")
