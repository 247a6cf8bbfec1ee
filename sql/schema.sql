-- rota's schema, whole: the tables, functions, triggers, row-level security, policies and
-- grants that `rota migrate` leaves in a database at the newest migration.
--
-- This file is the readable truth; sql/versions/ is how a database gets here.
-- tests/migration/ builds one database from this file and one by running every migration
-- from empty, and requires that they are the same (columns, constraints, indexes,
-- triggers, functions, policies, grants). A schema change is a new migration plus the same
-- change here. Rows are not part of it: migration 0001 fills iana_timezone with the zones
-- both PostgreSQL and Python's zoneinfo know, and migration 0015 writes rota_history's
-- one row (the instant the database was first migrated).
--
-- Two roles meet here. The owner (rota_owner in docs/deploy.md) runs rota's own
-- processes and bypasses row-level security. rota_app is the tenants' role: a tenant's
-- session sets rota.workspace_id, and every tenant table's policy shows it only that
-- workspace's rows; an unset setting reads as NULL and shows nothing. rota_app must exist
-- before this file is loaded (migration 0001 makes it where the migrator may).
--
-- Names are written schema-qualified and functions fix their own search_path, so no
-- object a session creates (a temporary table, a function in another schema) can stand in
-- for one of rota's.

SET check_function_bodies = false;
SELECT pg_catalog.set_config('search_path', '', false);

GRANT USAGE ON SCHEMA public TO rota_app;

-- ============================================================================
-- Periods: time zones and history
-- ============================================================================

-- A zone both PostgreSQL and Python's zoneinfo know. A duty's periods are computed in
-- Python and compared in SQL, so a zone only one side knows (PostgreSQL alone accepts
-- POSIX strings such as 'UTC+3', with the sign inverted) would plan wrongly.

CREATE TABLE public.iana_timezone (
    name text NOT NULL,
    CONSTRAINT iana_timezone_pkey PRIMARY KEY (name)
);

GRANT SELECT ON TABLE public.iana_timezone TO rota_app;

-- One row: the instant this database's rota history starts, where task's partitions
-- begin (`rota history-start` moves it), and the install, where the queue's and nightly
-- maintenance's partitions begin (nothing moves it).

CREATE TABLE public.rota_history (
    one_row boolean DEFAULT true NOT NULL,
    started_at timestamp with time zone NOT NULL,
    installed_at timestamp with time zone NOT NULL,
    CONSTRAINT rota_history_one_row CHECK (one_row),
    CONSTRAINT rota_history_pkey PRIMARY KEY (one_row)
);

-- ============================================================================
-- Dispatch: duties and the tasks produced from them
-- ============================================================================

-- A duty: recurring (one task per period of its frequency, in its time zone) or standing.
-- eligible_since: when the duty last became owed something new (created, unpaused,
-- re-windowed); the checks judge it only from then, and only rota's role moves it.
-- complete_from/complete_through: the span a scheduled run proved complete; the triggers
-- below clear it whenever that could stop being true, and a scheduled run skips a duty
-- whose span covers its work.

CREATE TABLE public.duty (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    workspace_id uuid NOT NULL,
    title text NOT NULL,
    kind text NOT NULL,
    frequency text,
    timezone text NOT NULL,
    lead_days integer DEFAULT 0 NOT NULL,
    effective_from date,
    effective_to date,
    state text DEFAULT 'active'::text NOT NULL,
    last_dispatched_period text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    complete_from text,
    complete_through text,
    eligible_since timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT duty_complete_span_whole CHECK (((complete_from IS NULL) = (complete_through IS NULL))),
    CONSTRAINT duty_effective_window_ordered CHECK (((effective_from IS NULL) OR (effective_to IS NULL) OR (effective_from <= effective_to))),
    CONSTRAINT duty_frequency_matches_kind CHECK (((kind = 'standing'::text) = (frequency IS NULL))),
    CONSTRAINT duty_frequency_valid CHECK ((frequency = ANY (ARRAY['daily'::text, 'weekly'::text, 'monthly'::text, 'quarterly'::text, 'yearly'::text]))),
    CONSTRAINT duty_kind_valid CHECK ((kind = ANY (ARRAY['recurring'::text, 'standing'::text]))),
    CONSTRAINT duty_lead_days_range CHECK (((lead_days >= 0) AND (lead_days <= 366))),
    CONSTRAINT duty_state_valid CHECK ((state = ANY (ARRAY['active'::text, 'paused'::text, 'archived'::text]))),
    CONSTRAINT duty_title_length CHECK (((char_length(title) >= 1) AND (char_length(title) <= 500))),
    CONSTRAINT duty_id_workspace_key UNIQUE (id, workspace_id),
    CONSTRAINT duty_pkey PRIMARY KEY (id),
    CONSTRAINT duty_timezone_known FOREIGN KEY (timezone) REFERENCES public.iana_timezone(name)
)
WITH (fillfactor='50');

ALTER TABLE ONLY public.duty FORCE ROW LEVEL SECURITY;

CREATE INDEX duty_dispatch_scan_idx ON public.duty USING btree (frequency, id);

-- What can make a duty newly owed is the trigger's WHEN clause, evaluated without a
-- function call: the dispatcher updates a million duties' marks on a large night.
CREATE FUNCTION public.duty_eligible_since_moves() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    NEW.eligible_since := now();
    RETURN NEW;
END
$$;

CREATE FUNCTION public.duty_frequency_fixed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
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
    END
    $$;

CREATE FUNCTION public.duty_window_moved() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    BEGIN
        NEW.complete_from := NULL;
        NEW.complete_through := NULL;
        RETURN NEW;
    END
    $$;

CREATE FUNCTION public.task_duty_has_no_tasks() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
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
    END
    $$;

CREATE FUNCTION public.task_duty_truncated_with_tasks() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM public.task) THEN
            RAISE EXCEPTION 'duty was truncated while task still has rows; truncate both together'
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'task_duty_fkey', TABLE = 'duty';
        END IF;
        RETURN NULL;
    END
    $$;

CREATE TRIGGER duty_eligible_since_moves BEFORE UPDATE ON public.duty FOR EACH ROW
    WHEN (NEW.eligible_since IS NOT DISTINCT FROM OLD.eligible_since  -- set on purpose, by a role that may
          AND ((NEW.state = 'active' AND OLD.state IS DISTINCT FROM 'active')
               OR NEW.kind IS DISTINCT FROM OLD.kind
               OR NEW.frequency IS DISTINCT FROM OLD.frequency
               OR NEW.timezone IS DISTINCT FROM OLD.timezone
               OR NEW.lead_days > OLD.lead_days
               OR (OLD.effective_from IS NOT NULL AND (NEW.effective_from IS NULL OR NEW.effective_from < OLD.effective_from))
               OR (OLD.effective_to IS NOT NULL AND (NEW.effective_to IS NULL OR NEW.effective_to > OLD.effective_to))))
    EXECUTE FUNCTION public.duty_eligible_since_moves();

CREATE TRIGGER duty_frequency_fixed BEFORE UPDATE OF frequency, kind ON public.duty FOR EACH ROW WHEN (((old.frequency IS DISTINCT FROM new.frequency) OR (old.kind IS DISTINCT FROM new.kind))) EXECUTE FUNCTION public.duty_frequency_fixed();

CREATE TRIGGER duty_window_moved BEFORE UPDATE OF effective_from, effective_to ON public.duty FOR EACH ROW WHEN (((old.effective_from IS DISTINCT FROM new.effective_from) OR (old.effective_to IS DISTINCT FROM new.effective_to))) EXECUTE FUNCTION public.duty_window_moved();

CREATE TRIGGER task_duty_fkey_delete AFTER DELETE ON public.duty FOR EACH ROW EXECUTE FUNCTION public.task_duty_has_no_tasks();

CREATE TRIGGER task_duty_fkey_move AFTER UPDATE OF id, workspace_id ON public.duty FOR EACH ROW WHEN (((old.id IS DISTINCT FROM new.id) OR (old.workspace_id IS DISTINCT FROM new.workspace_id))) EXECUTE FUNCTION public.task_duty_has_no_tasks();

CREATE TRIGGER task_duty_fkey_truncate AFTER TRUNCATE ON public.duty FOR EACH STATEMENT EXECUTE FUNCTION public.task_duty_truncated_with_tasks();

ALTER TABLE public.duty ENABLE ROW LEVEL SECURITY;

CREATE POLICY duty_workspace_isolation ON public.duty USING ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid)) WITH CHECK ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid));

REVOKE ALL ON FUNCTION public.duty_eligible_since_moves(),
    public.duty_frequency_fixed(),
    public.duty_window_moved(),
    public.task_duty_has_no_tasks(),
    public.task_duty_truncated_with_tasks() FROM PUBLIC;

GRANT SELECT,DELETE ON TABLE public.duty TO rota_app;

GRANT INSERT (workspace_id, title, kind, frequency, timezone, lead_days, effective_from, effective_to, state, updated_at) ON TABLE public.duty TO rota_app;

GRANT UPDATE (title, kind, frequency, timezone, lead_days, effective_from, effective_to, state, updated_at) ON TABLE public.duty TO rota_app;

-- A task: one duty's work for one period. task_dispatch_identity is the identity of
-- dispatched work: producing a task is an insert that may conflict there. Partitioned by
-- period_key (byte order, so a year's keys sort between 'YYYY' and 'YYYY~'); partitions
-- are made by rota_ensure_task_partitions before a write.
--
-- task (duty_id, workspace_id) -> duty (id, workspace_id) is enforced by triggers under
-- the name task_duty_fkey, not a foreign key: a row trigger on insert, skipped only in a
-- transaction that vouches for its duties (the dispatcher sets rota.task_duties_held to
-- its own transaction id and holds every duty it writes for), and triggers on duty for
-- delete, move and truncate. A declarative foreign key would check every row the
-- dispatcher inserts: 3,000,000 tasks took 26 s of server time under one, 10 s with the
-- skip (docs/perf.md).

CREATE TABLE public.task (
    id bigint GENERATED BY DEFAULT AS IDENTITY NOT NULL,
    duty_id bigint NOT NULL,
    workspace_id uuid NOT NULL,
    period_key text NOT NULL COLLATE pg_catalog."C",
    period_start date NOT NULL,
    due_date date NOT NULL,
    visible_from date NOT NULL,
    status text DEFAULT 'open'::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT task_period_ordered CHECK (((period_start <= due_date) AND (visible_from <= due_date))),
    CONSTRAINT task_status_valid CHECK ((status = ANY (ARRAY['open'::text, 'done'::text, 'skipped'::text]))),
    CONSTRAINT task_dispatch_identity UNIQUE (duty_id, period_key),
    CONSTRAINT task_pkey PRIMARY KEY (id, period_key)
)
PARTITION BY RANGE (period_key);

ALTER TABLE ONLY public.task FORCE ROW LEVEL SECURITY;

CREATE FUNCTION public.rota_ensure_task_partitions(period_keys text[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
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
        -- The lock ATTACH takes on task alone (ONLY: not on its partitions, which
        -- autovacuum works on), taken first: makers wait for each other, and for nothing
        -- a tenant may hold.
        LOCK TABLE ONLY public.task IN SHARE UPDATE EXCLUSIVE MODE;
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
$$;

CREATE FUNCTION public.rota_task_partition_of(period_key text, OUT name text, OUT lower_bound text, OUT upper_bound text) RETURNS record
    LANGUAGE plpgsql IMMUTABLE STRICT
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $_$
DECLARE
    year text := substr(period_key, 1, 4);
    part int;
BEGIN
    IF period_key ~ '^\d{4}$' THEN
        name := 'task_' || year;
        lower_bound := year;
        upper_bound := year || '-01';
    ELSIF period_key ~ '^\d{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?$' THEN
        part := CASE WHEN length(period_key) = 7 THEN 0
                     ELSE least((substr(period_key, 9, 2)::int - 1) / 8, 3) END;
        name := 'task_' || year || '_' || substr(period_key, 6, 2) || '_' || chr(ascii('a') + part);
        lower_bound := substr(period_key, 1, 7) || (ARRAY['', '-09', '-17', '-25'])[part + 1];
        upper_bound := substr(period_key, 1, 7) || (ARRAY['-09', '-17', '-25', '~'])[part + 1];
    ELSIF period_key ~ '^\d{4}-Q[1-4]$' THEN
        name := 'task_' || year || '_q';
        lower_bound := year || '-Q';
        upper_bound := year || '-R';
    ELSIF period_key ~ '^\d{4}-W(0[1-9]|[1-4]\d|5[0-3])$' THEN
        part := least((substr(period_key, 7, 2)::int - 1) / 13, 3);
        name := 'task_' || year || '_w_' || (part + 1);
        lower_bound := year || '-W' || (ARRAY['', '14', '27', '40'])[part + 1];
        upper_bound := year || (ARRAY['-W14', '-W27', '-W40', '-X'])[part + 1];
    ELSE
        RAISE EXCEPTION 'period key "%" is no frequency''s key (2026, 2026-Q3, 2026-08, 2026-W35, 2026-08-31), so no partition of task holds it',
            period_key USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$_$;

CREATE FUNCTION public.task_duty_exists() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
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
    END
    $$;

CREATE FUNCTION public.task_moved_clears_span() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    BEGIN
        UPDATE public.duty SET complete_from = NULL, complete_through = NULL WHERE id = OLD.duty_id;
        RETURN NULL;
    END
    $$;

CREATE FUNCTION public.task_removed_clears_span() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    BEGIN
        UPDATE public.duty SET complete_from = NULL, complete_through = NULL
        WHERE id IN (SELECT DISTINCT duty_id FROM removed);
        RETURN NULL;
    END
    $$;

CREATE FUNCTION public.task_truncated_clears_spans() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    BEGIN
        UPDATE public.duty SET complete_from = NULL, complete_through = NULL WHERE complete_from IS NOT NULL;
        RETURN NULL;
    END
    $$;

SET default_tablespace = '';

SET default_table_access_method = heap;

CREATE TRIGGER task_duty_fkey_insert AFTER INSERT ON public.task FOR EACH ROW WHEN ((current_setting('rota.task_duties_held'::text, true) IS DISTINCT FROM (pg_current_xact_id())::text)) EXECUTE FUNCTION public.task_duty_exists();

CREATE TRIGGER task_duty_fkey_update AFTER UPDATE OF duty_id, workspace_id ON public.task FOR EACH ROW WHEN (((old.duty_id IS DISTINCT FROM new.duty_id) OR (old.workspace_id IS DISTINCT FROM new.workspace_id))) EXECUTE FUNCTION public.task_duty_exists();

CREATE TRIGGER task_moved_clears_span AFTER UPDATE OF duty_id, period_key ON public.task FOR EACH ROW WHEN (((old.duty_id IS DISTINCT FROM new.duty_id) OR (old.period_key IS DISTINCT FROM new.period_key))) EXECUTE FUNCTION public.task_moved_clears_span();

CREATE TRIGGER task_removed_clears_span AFTER DELETE ON public.task REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION public.task_removed_clears_span();

CREATE TRIGGER task_truncated_clears_spans AFTER TRUNCATE ON public.task FOR EACH STATEMENT EXECUTE FUNCTION public.task_truncated_clears_spans();

ALTER TABLE public.task ENABLE ROW LEVEL SECURITY;

CREATE POLICY task_workspace_isolation ON public.task USING ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid)) WITH CHECK ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid));

REVOKE ALL ON FUNCTION public.task_duty_exists(),
    public.task_moved_clears_span(),
    public.task_removed_clears_span(),
    public.task_truncated_clears_spans() FROM PUBLIC;

GRANT SELECT ON TABLE public.task TO rota_app;

GRANT UPDATE (status, updated_at) ON TABLE public.task TO rota_app;

-- A lock per frequency (migration 0025 writes the rows). Every dispatch page holds its
-- frequency's row FOR KEY SHARE for its transaction, so a run that locks the row FOR
-- UPDATE without waiting knows that no page of the frequency holds a duty row, and that
-- a duty row still held is a tenant's (pipelines/dispatch/writing.py's
-- move_deferred_marks). No grants: no tenant can lock it.

CREATE TABLE public.dispatch_page_lock (
    frequency text NOT NULL,
    CONSTRAINT dispatch_page_lock_frequency_valid CHECK ((frequency = ANY (ARRAY['daily'::text, 'weekly'::text, 'monthly'::text, 'quarterly'::text, 'yearly'::text]))),
    CONSTRAINT dispatch_page_lock_pkey PRIMARY KEY (frequency)
);

-- ============================================================================
-- Queue: jobs, events, runs and the sources' cursors
-- ============================================================================

-- A job: what runs, on a cron schedule in a time zone, on an event type, or from a source.
-- scheduled_since: when its fire times became owed (registered, re-enabled, re-scheduled).

CREATE TABLE public.job (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    name text NOT NULL,
    workspace_id uuid,
    schedule text,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    event_type text,
    enabled boolean DEFAULT true NOT NULL,
    max_attempts integer DEFAULT 5 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    scheduled_since timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT job_max_attempts_range CHECK (((max_attempts >= 1) AND (max_attempts <= 100))),
    CONSTRAINT job_name_length CHECK (((char_length(name) >= 1) AND (char_length(name) <= 200))),
    CONSTRAINT job_schedule_cron_shape CHECK ((schedule ~ '^\s*[0-9A-Za-z*/,?#-]+(\s+[0-9A-Za-z*/,?#-]+){4}\s*$'::text)),
    CONSTRAINT job_name_key UNIQUE (name),
    CONSTRAINT job_pkey PRIMARY KEY (id),
    CONSTRAINT job_timezone_known FOREIGN KEY (timezone) REFERENCES public.iana_timezone(name)
);

ALTER TABLE ONLY public.job FORCE ROW LEVEL SECURITY;

CREATE FUNCTION public.job_scheduled_since_moves() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    NEW.scheduled_since := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER job_scheduled_since_moves BEFORE UPDATE ON public.job FOR EACH ROW
    WHEN (NEW.scheduled_since IS NOT DISTINCT FROM OLD.scheduled_since
          AND ((NEW.enabled AND NOT OLD.enabled)
               OR NEW.schedule IS DISTINCT FROM OLD.schedule
               OR NEW.timezone IS DISTINCT FROM OLD.timezone))
    EXECUTE FUNCTION public.job_scheduled_since_moves();

ALTER TABLE public.job ENABLE ROW LEVEL SECURITY;

CREATE POLICY job_workspace_isolation ON public.job USING ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid)) WITH CHECK ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid));

REVOKE ALL ON FUNCTION public.job_scheduled_since_moves() FROM PUBLIC;

GRANT SELECT ON TABLE public.job TO rota_app;

-- An event a tenant records; the event sensor queues its runs and sets dispatched_at.

CREATE TABLE public.event (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    workspace_id uuid,
    type text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    occurred_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatched_at timestamp with time zone,
    CONSTRAINT event_pkey PRIMARY KEY (id)
);

ALTER TABLE ONLY public.event FORCE ROW LEVEL SECURITY;

CREATE INDEX event_dispatch_pending_idx ON public.event USING btree (dispatched_at, id);

ALTER TABLE public.event ENABLE ROW LEVEL SECURITY;

CREATE POLICY event_workspace_isolation ON public.event USING ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid)) WITH CHECK ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid));

GRANT SELECT ON TABLE public.event TO rota_app;

GRANT INSERT (workspace_id, type, payload, occurred_at) ON TABLE public.event TO rota_app;

-- One row per run. Every run has exactly one origin (a schedule's fire time, an event, a
-- source's reference), and each origin has its own identity constraint: producing a run is
-- an insert whose conflict is an expected outcome. Workers claim through
-- job_queue_complete_and_claim; tenants may read, never write.

CREATE TABLE public.job_queue (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    job_id bigint NOT NULL,
    workspace_id uuid,
    event_id bigint,
    scheduled_for timestamp with time zone,
    source text,
    source_ref text,
    state text DEFAULT 'queued'::text NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    started_at timestamp with time zone,
    operator_action text,
    operator_action_at timestamp with time zone,
    operator_run_id text,
    unscheduled_at timestamp with time zone,
    CONSTRAINT job_queue_attempts_non_negative CHECK ((attempts >= 0)),
    CONSTRAINT job_queue_lease_matches_state CHECK (((state = 'running'::text) = ((lease_owner IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT job_queue_one_origin CHECK ((num_nonnulls(scheduled_for, event_id, source_ref) = 1)),
    CONSTRAINT job_queue_operator_action_recorded CHECK ((((operator_action IS NULL) = (operator_action_at IS NULL)) AND ((operator_action IS NULL) = (operator_run_id IS NULL)))),
    CONSTRAINT job_queue_operator_action_valid CHECK ((operator_action = ANY (ARRAY['retried'::text, 'cancelled'::text]))),
    CONSTRAINT job_queue_source_has_ref CHECK (((source IS NULL) = (source_ref IS NULL))),
    CONSTRAINT job_queue_source_ref_length CHECK (((char_length(source_ref) >= 1) AND (char_length(source_ref) <= 1000))),
    CONSTRAINT job_queue_unscheduled_is_cancelled CHECK (((unscheduled_at IS NULL) OR (state = 'cancelled'::text))),
    CONSTRAINT job_queue_state_valid CHECK ((state = ANY (ARRAY['queued'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text]))),
    CONSTRAINT job_queue_event_identity UNIQUE (event_id, job_id),
    CONSTRAINT job_queue_pkey PRIMARY KEY (id),
    CONSTRAINT job_queue_schedule_identity UNIQUE (job_id, scheduled_for),
    CONSTRAINT job_queue_source_identity UNIQUE (source, source_ref),
    CONSTRAINT job_queue_event_id_fkey FOREIGN KEY (event_id) REFERENCES public.event(id),
    CONSTRAINT job_queue_job_id_fkey FOREIGN KEY (job_id) REFERENCES public.job(id)
);

ALTER TABLE ONLY public.job_queue FORCE ROW LEVEL SECURITY;

COMMENT ON CONSTRAINT job_queue_event_identity ON public.job_queue IS 'One of three complementary identities of job_queue (schedule, event, source): every run has exactly one origin (job_queue_one_origin) and NULLs are distinct, so each constraint binds only runs of its own origin. Producing is an insert whose conflict here is an expected outcome.';

COMMENT ON CONSTRAINT job_queue_schedule_identity ON public.job_queue IS 'One of three complementary identities of job_queue (schedule, event, source): every run has exactly one origin (job_queue_one_origin) and NULLs are distinct, so each constraint binds only runs of its own origin. Producing is an insert whose conflict here is an expected outcome.';

COMMENT ON CONSTRAINT job_queue_source_identity ON public.job_queue IS 'One of three complementary identities of job_queue (schedule, event, source): every run has exactly one origin (job_queue_one_origin) and NULLs are distinct, so each constraint binds only runs of its own origin. Producing is an insert whose conflict here is an expected outcome.';

CREATE INDEX job_queue_claim_idx ON public.job_queue USING btree (state, run_at);

CREATE INDEX job_queue_unscheduled_idx ON public.job_queue USING btree (job_id, scheduled_for) WHERE (unscheduled_at IS NOT NULL);

CREATE FUNCTION public.job_queue_announce_runs() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    BEGIN
        IF EXISTS (SELECT FROM queued) THEN
            PERFORM pg_notify('rota_runs_queued', '');
        END IF;
        RETURN NULL;
    END
    $$;

CREATE FUNCTION public.job_queue_complete_and_claim(finished_ids bigint[], worker_id text, claim_limit integer, lease_seconds double precision) RETURNS TABLE(recorded bigint[], id bigint, job_id bigint, job_name text, workspace_id uuid, attempts integer, max_attempts integer, payload jsonb, scheduled_for timestamp with time zone, event_id bigint, source text, source_ref text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
        #variable_conflict use_column
        DECLARE
            recorded_ids bigint[];
        BEGIN
            -- The finished runs first, in a statement of their own. A claim's FOR UPDATE
            -- SKIP LOCKED may lock a row in passing: the newest version of a run another
            -- worker claimed after the claim's snapshot, which then fails the recheck
            -- but stays locked until that claim commits. A worker recording a finished
            -- run may wait for such a lock; it must do so while its own claim holds
            -- none, or two workers can each wait for the other (deadlock detected).
            --
            -- A finished run is found by its id alone. It must still be this worker's:
            -- a lease owner is set exactly while a run is running (the constraint
            -- job_queue_lease_matches_state), so no `state = 'running'` is asked, which
            -- the planner could answer from job_queue_claim_idx's 'running' range (a walk
            -- over every run in progress and their dead versions) whenever its statistics
            -- say few runs are running.
            WITH finished AS (
                UPDATE job_queue q
                SET state = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
                    updated_at = now()
                FROM unnest(finished_ids) AS f (id)
                WHERE q.id = f.id AND q.lease_owner = worker_id
                RETURNING q.id
            )
            SELECT array_agg(id) INTO recorded_ids FROM finished;
            -- A run whose job was disabled after it was queued is cancelled, not handed
            -- out. The one-row join returns the finished ids even when nothing is claimed.
            RETURN QUERY
            WITH due AS (
                SELECT q.id
                FROM job_queue q
                WHERE q.state = 'queued' AND q.run_at <= now()
                ORDER BY q.run_at
                LIMIT claim_limit
                FOR UPDATE SKIP LOCKED
            ),
            claimed AS (
                UPDATE job_queue q
                SET state = CASE WHEN j.enabled THEN 'running' ELSE 'cancelled' END,
                    attempts = q.attempts + CASE WHEN j.enabled THEN 1 ELSE 0 END,
                    lease_owner = CASE WHEN j.enabled THEN worker_id END,
                    lease_expires_at = CASE WHEN j.enabled THEN now() + make_interval(secs => lease_seconds) END,
                    started_at = CASE WHEN j.enabled THEN now() ELSE q.started_at END,
                    finished_at = CASE WHEN j.enabled THEN NULL ELSE now() END,
                    last_error = CASE WHEN j.enabled THEN q.last_error
                                 ELSE 'cancelled: job ' || j.name || ' was disabled after this run was queued' END,
                    updated_at = now()
                FROM due, job j
                WHERE q.id = due.id AND j.id = q.job_id
                RETURNING q.id, q.job_id, j.name, q.workspace_id, q.attempts, j.max_attempts, q.payload,
                          q.scheduled_for, q.event_id, q.source, q.source_ref, j.enabled
            )
            SELECT recorded_ids, c.id, c.job_id, c.name, c.workspace_id, c.attempts,
                   c.max_attempts, c.payload, c.scheduled_for, c.event_id, c.source, c.source_ref
            FROM (VALUES (1)) AS one (n) LEFT JOIN claimed c ON c.enabled
            ORDER BY c.id;
        END
        $$;

CREATE TRIGGER job_queue_wakes_workers AFTER INSERT ON public.job_queue REFERENCING NEW TABLE AS queued FOR EACH STATEMENT EXECUTE FUNCTION public.job_queue_announce_runs();

ALTER TABLE public.job_queue ENABLE ROW LEVEL SECURITY;

CREATE POLICY job_queue_workspace_isolation ON public.job_queue USING ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid)) WITH CHECK ((workspace_id = (NULLIF(current_setting('rota.workspace_id'::text, true), ''::text))::uuid));

REVOKE ALL ON FUNCTION public.job_queue_announce_runs(),
    public.job_queue_complete_and_claim(finished_ids bigint[], worker_id text, claim_limit integer, lease_seconds double precision) FROM PUBLIC;

GRANT SELECT ON TABLE public.job_queue TO rota_app;

-- Where a source's poll of one scope (a GitHub repository) got to, written in the same
-- transaction as the runs that poll produced.

CREATE TABLE public.source_cursor (
    source text NOT NULL,
    scope text NOT NULL,
    cursor jsonb NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT source_cursor_pkey PRIMARY KEY (source, scope)
);
