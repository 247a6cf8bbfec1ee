"""Task partitions are made under the lock ATTACH takes, not an advisory lock

rota_ensure_task_partitions serialised its makers with an advisory lock, and any role
can take any advisory lock: a tenant holding `pg_advisory_xact_lock(hashtext('rota task
partitions'))` in a transaction left open made the first run of a new partition's range
wait for as long as it liked. Makers now take task alone (ONLY) in SHARE UPDATE EXCLUSIVE
mode, as ATTACH PARTITION does anyway: it conflicts with itself, and with nothing a
tenant may take on task (reads, FOR UPDATE, an UPDATE of a task's status).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-08
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

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
        LOCK_LINE
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

_ATTACHS_LOCK = """-- The lock ATTACH takes on task alone (ONLY: not on its partitions, which
        -- autovacuum works on), taken first: makers wait for each other, and for nothing
        -- a tenant may hold.
        LOCK TABLE ONLY public.task IN SHARE UPDATE EXCLUSIVE MODE;"""
_ADVISORY_LOCK = "PERFORM pg_advisory_xact_lock(hashtext('rota task partitions'));"


def upgrade() -> None:
    op.execute(_ENSURE.replace("LOCK_LINE", _ATTACHS_LOCK))


def downgrade() -> None:
    op.execute(_ENSURE.replace("LOCK_LINE", _ADVISORY_LOCK))
