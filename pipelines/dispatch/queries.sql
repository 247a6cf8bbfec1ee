-- The dispatcher's statements (pipelines/dispatch): reading duties a keyset page at a time,
-- writing a page's tasks, and the completeness check. Loaded by name
-- (rota.resources.database.queries); psycopg parameters.
--
-- Period arithmetic takes its parameters from pipelines/periods/calendar.py
-- (calendar_units): %(unit)s is date_trunc's unit, %(step)s one period as an interval,
-- %(key_format)s to_char's format of a period key. Dates are cast to `timestamp` so no
-- session TimeZone takes part in the calendar arithmetic.
--
-- Pieces several statements share are fragments, spliced into each where it names them
-- (rota.resources.database.queries).

-- fragment: zone_today
-- A duty's local today, z.today, is one CASE: a zone's today is one of at most three dates
-- on Earth at one instant, so three WHENs, each a set of zones (a comma-separated string:
-- a 600-element text array costs more to bind than the query takes to run; zone names
-- hold no comma) and its date. An unused WHEN gets no zones. A zone Python does not know
-- has no today (NULL). It is an expression, not a join: a join with the zone list cannot
-- hand rows on in index order, so every page would sort all the duties after it
-- (docs/perf.md).
CROSS JOIN LATERAL (
    SELECT CASE WHEN d.timezone = ANY(string_to_array(%(zones_0)s, ',')) THEN CAST(%(day_0)s AS date)
                WHEN d.timezone = ANY(string_to_array(%(zones_1)s, ',')) THEN CAST(%(day_1)s AS date)
                WHEN d.timezone = ANY(string_to_array(%(zones_2)s, ',')) THEN CAST(%(day_2)s AS date) END AS today
) z;

-- fragment: duty_row
-- What a page reads of each duty: planner.DutyRow's fields, in its order.
SELECT id, kind, frequency, timezone, lead_days, effective_from, effective_to, state,
       complete_from, complete_through, CAST(CAST(d.xmin AS text) AS bigint), last_dispatched_period,
       uuid_send(workspace_id)
FROM duty d;

-- name: read_page
-- A backfill reads every dispatchable duty of the frequency.
/* fragment: duty_row */
WHERE frequency = %(frequency)s AND kind = 'recurring' AND state = 'active' AND id > %(after)s
ORDER BY id
LIMIT %(page_size)s;

-- name: read_page_scheduled
-- A scheduled run offers a duty nothing when its local today lies outside its window, or
-- when the span its last scheduled run proved complete (complete_from..complete_through,
-- cleared by the schema's triggers whenever a task goes or the window moves) covers every
-- period this run could emit for it: from the current period to the newest one it may
-- emit. That newest one is the current period, or the last one whose visible_from has
-- come if later (the newest period whose last day is on or before today + lead_days), but
-- none due after the window closes (the newest period whose last day is on or before
-- effective_to). Every such period inside the window then has a task, so skipping the
-- duty changes nothing that is created; last_dispatched_period proves nothing of the kind
-- (a backfill of a later period moves it past a current period that does not exist) and
-- takes no part. It is a pre-filter only: every duty it lets through is planned by the
-- planner, and a test holds it against the planner's full rules after random backfills,
-- pauses and edits. A duty whose zone has no today is always read, so the planner can
-- report it.
/* fragment: duty_row */
/* fragment: zone_today */
CROSS JOIN LATERAL (
    SELECT date_trunc(%(unit)s, CAST(z.today + d.lead_days AS timestamp)) AS lead_start,
           CAST(z.today + d.lead_days AS timestamp) AS lead_day,
           date_trunc(%(unit)s, CAST(d.effective_to AS timestamp)) AS end_start,
           CAST(d.effective_to AS timestamp) AS end_day
) b
WHERE frequency = %(frequency)s AND kind = 'recurring' AND state = 'active' AND id > %(after)s
  AND (z.today IS NULL OR (
      (d.effective_from IS NULL OR d.effective_from <= z.today)
      AND (d.effective_to IS NULL OR z.today <= d.effective_to)
      AND NOT (d.complete_from IS NOT NULL
               AND d.complete_from <= to_char(date_trunc(%(unit)s, CAST(z.today AS timestamp)), %(key_format)s)
               AND to_char(
                   least(greatest(date_trunc(%(unit)s, CAST(z.today AS timestamp)),
                                  CASE WHEN b.lead_start + CAST(%(step)s AS interval) - interval '1 day' <= b.lead_day
                                       THEN b.lead_start
                                       ELSE date_trunc(%(unit)s, b.lead_start - interval '1 day') END),
                         CASE WHEN d.effective_to IS NULL THEN NULL
                              WHEN b.end_start + CAST(%(step)s AS interval) - interval '1 day' <= b.end_day
                              THEN b.end_start
                              ELSE date_trunc(%(unit)s, b.end_start - interval '1 day') END),
                   %(key_format)s) <= d.complete_through)))
ORDER BY id
LIMIT %(page_size)s;

-- name: create_offered_period
-- A page's plan reaches the server by binary COPY into two temporary tables: the period
-- rows of each (timezone, lead_days) group, and one slice of them per duty. SQL expands
-- them into task rows, so no task row is built, sent or bound in Python (binding rows
-- costs more than inserting them: docs/perf.md). The tables live as long as the pooled
-- connection and are emptied at every commit. period_key is compared in task's collation:
-- in any other, the anti-join cannot use task_dispatch_identity's second column or prune
-- task's partitions, and probes every partition for all of a duty's tasks.
CREATE TEMPORARY TABLE IF NOT EXISTS offered_period (
    period_group int, period_index int, period_key text COLLATE "C",
    period_start date, due_date date, visible_from date, span_from text, span_through text
) ON COMMIT DELETE ROWS;

-- name: create_offered_duty
CREATE TEMPORARY TABLE IF NOT EXISTS offered_duty (
    duty_id bigint, period_group int, first_index int, last_index int, version bigint, workspace uuid
) ON COMMIT DELETE ROWS;

-- name: hold_page_lock
-- A page's first statement: no duty row is locked by a page that does not hold its
-- frequency's row of dispatch_page_lock (move_deferred_marks). Only pages_paused
-- conflicts with it, and that transaction waits on no duty row.
SELECT frequency FROM dispatch_page_lock WHERE frequency = %(frequency)s FOR KEY SHARE;

-- name: page_settings
-- A backfill page sorts hundreds of thousands of offered tasks into identity order, which
-- the default work_mem spills to disk (docs/perf.md). The page also vouches, for its own
-- transaction only, that every task it inserts comes from a duty row its statement holds
-- (the `locked` step of insert_new and insert_careful, or advance_new's row locks), so
-- task_duty_fkey_insert does not check them again. On the bulk path that word rests on
-- writing.py's _copy_tasks, which COPYs only when advance_new moved every duty still on
-- offer, each still in the workspace the COPY names.
--
-- lock_timeout bounds how long the page waits on a lock: a fast-path page gives up on a
-- duty row a tenant holds (an open UPDATE, FOR UPDATE) within a moment and is written
-- again, the held duties by insert_careful (offer_only_free), which waits on no tenant's
-- row ('0': insert_careful waits only on a racing writer's uncommitted tasks, and on a
-- lock on a whole table, which a tenant can take on duty since it may delete duties:
-- docs/guarantees.md, "A tenant's open transaction").
SELECT set_config('work_mem', '64MB', true),
       set_config('rota.task_duties_held', CAST(pg_current_xact_id() AS text), true),
       set_config('lock_timeout', %(lock_timeout)s, true);

-- name: copy_offered_periods
COPY offered_period (period_group, period_index, period_key, period_start, due_date, visible_from,
                     span_from, span_through)
FROM STDIN (FORMAT BINARY);

-- name: copy_offered_duties
COPY offered_duty (duty_id, period_group, first_index, last_index, version, workspace) FROM STDIN (FORMAT BINARY);

-- fragment: offered_duties
-- Each duty a page offers as the duty row stands (its statement then locks it): the
-- page's frequency and id range let the lookup use duty_dispatch_scan_idx.
SELECT d.id, d.workspace_id, o.period_group, o.first_index, o.last_index
FROM offered_duty o
JOIN duty d ON d.id = o.duty_id AND d.frequency = %(frequency)s
           AND d.id BETWEEN %(first_id)s AND %(last_id)s;

-- fragment: offered_tasks
-- The offered tasks of the duties `locked` holds, each with its duty's workspace.
offered AS (
    SELECT l.id AS duty_id, p.period_key, l.workspace_id, p.period_start, p.due_date, p.visible_from
    FROM locked l
    JOIN offered_period p ON p.period_group = l.period_group
                         AND p.period_index BETWEEN l.first_index AND l.last_index
);

-- fragment: insert_missing
-- The offered tasks that do not exist, inserted in identity order (racing writers that
-- insert in different orders deadlock); the statement says what a conflict does.
INSERT INTO task (duty_id, period_key, workspace_id, period_start, due_date, visible_from)
SELECT o.duty_id, o.period_key, o.workspace_id, o.period_start, o.due_date, o.visible_from
FROM offered o
WHERE NOT EXISTS (
    SELECT 1 FROM task t
    WHERE t.duty_id = o.duty_id AND t.period_key = o.period_key AND t.period_key = ANY(%(keys)s)
)
ORDER BY o.duty_id, o.period_key;

-- fragment: marks_moved
-- A duty's marks moved to its newest offered period n: last_dispatched_period only
-- forward, and the span a scheduled run made complete only where the row is still the
-- version the plan was made from (insert_new says why).
SET last_dispatched_period = greatest(d.last_dispatched_period, n.period_key),
    complete_from = CASE WHEN n.span_from IS NULL THEN d.complete_from
                         WHEN CAST(CAST(d.xmin AS text) AS bigint) = n.version THEN n.span_from END,
    complete_through = CASE WHEN n.span_from IS NULL THEN d.complete_through
                            WHEN CAST(CAST(d.xmin AS text) AS bigint) = n.version THEN n.span_through END;

-- name: insert_new
-- A page's tasks, written with their duties' marks in one statement.
--
-- `locked`, `offered`: the offered tasks, each with its duty's workspace read from the
-- duty row itself, which is held FOR KEY SHARE until commit: a duty deleted first offers
-- nothing, and one deleted later waits and then finds these tasks (the task_duty_fkey
-- triggers refuse it). This is the foreign key's check and lock, done once for the page:
-- the page vouches for it (page_settings), and the lock must stay or nothing else guards
-- these rows.
--
-- `inserted`: rows that already exist are filtered out inside the INSERT, so they
-- consume no identity value. The page's keys, as a constant, prune the anti-join to the
-- partitions that can hold them: joined on period_key alone, the planner probes every
-- partition of task. This is the happy path, a plain INSERT, cheaper a row than one with
-- ON CONFLICT (docs/perf.md): a racing writer is the only way its anti-join can miss a
-- row, and then task_dispatch_identity refuses it, the page's transaction rolls back and
-- is written again by insert_careful.
--
-- `advanced`: last_dispatched_period moves in the same statement as the tasks that move
-- it, and only forward: keys of one frequency sort chronologically. A scheduled run also
-- records the span it made complete, but only where the duty row is still the version it
-- planned from (its xmin): anything that cleared the span since (a task deleted, the
-- window moved) left a newer version, and the periods the plan took as existing on the
-- old span's word are then unproven. A duty given no new task is not written at all.
WITH locked AS MATERIALIZED (
    /* fragment: offered_duties */
    FOR KEY SHARE OF d
),
/* fragment: offered_tasks */,
inserted AS (
    /* fragment: insert_missing */
    RETURNING duty_id, period_key
),
newest AS (
    SELECT i.duty_id, max(i.period_key) AS period_key, count(*) AS created,
           min(o.version) AS version, min(p.span_from) AS span_from, min(p.span_through) AS span_through
    FROM inserted i
    JOIN offered_duty o ON o.duty_id = i.duty_id
    JOIN offered_period p ON p.period_group = o.period_group AND p.period_index = o.first_index
    GROUP BY i.duty_id
),
advanced AS (
    UPDATE duty d
    /* fragment: marks_moved */
    FROM newest n
    WHERE d.id = n.duty_id AND d.frequency = %(frequency)s AND d.id BETWEEN %(first_id)s AND %(last_id)s
      AND (d.last_dispatched_period IS NULL OR d.last_dispatched_period < n.period_key
           OR n.span_from IS NOT NULL)
    RETURNING d.id
)
SELECT duty_id, NULL AS period_key, created FROM newest
UNION ALL
SELECT NULL, period_key, count(*) FROM inserted GROUP BY period_key;

-- name: insert_careful
-- A page the fast path could not write: a racing writer made some of its tasks first
-- (task_dispatch_identity refused insert_new or the COPY), a row it needed stayed locked
-- past the fast path's lock_timeout (page_settings), or advance_new found a duty deleted
-- or moved since the page was read. Or only the duties of a bulk page that
-- offer_only_free left out, the rest of the page written on the bulk path. It takes each
-- duty as it stands and waits on no duty row a tenant holds:
--
-- `locked`: the foreign key's lock, FOR KEY SHARE, which only a transaction about to
-- delete the duty or change its key conflicts with (FOR UPDATE, DELETE, a move); SKIP
-- LOCKED leaves such a duty out. `held` reports each of its offered periods that has no
-- task, found on the statement's snapshot: that task waits for the first run after the
-- transaction ends, since a duty being deleted must not gain one.
--
-- `inserted`: as insert_new, with ON CONFLICT letting task_dispatch_identity skip what the
-- racer made. Once it has run, every offered task of a locked duty exists, inserted or
-- found.
--
-- `movable`: the marks move to the newest of those tasks, inserted or found, so marks an
-- earlier page could not move catch up here; but only for duties whose rows can be locked
-- FOR NO KEY UPDATE now. Another run's page, or a tenant's open UPDATE (a title, say) or
-- FOR SHARE, keeps a duty's marks where they are, and `deferred` returns the mark it would
-- take: the run moves it once its pages are written and the page has let go
-- (writing.py's move_deferred_marks), and reports the duties a tenant still holds. Marks
-- only say what a later run may skip or how it writes, so an old mark costs that run work,
-- never a task. Only a mark that changes is written.
WITH locked AS MATERIALIZED (
    /* fragment: offered_duties */
    FOR KEY SHARE OF d SKIP LOCKED
),
held AS (
    SELECT o.duty_id, p.period_key FROM offered_duty o
    JOIN offered_period p ON p.period_group = o.period_group
                         AND p.period_index BETWEEN o.first_index AND o.last_index
    WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.id = o.duty_id)
      AND EXISTS (SELECT 1 FROM duty d WHERE d.id = o.duty_id AND d.frequency = %(frequency)s
                                         AND d.id BETWEEN %(first_id)s AND %(last_id)s)
      AND NOT EXISTS (SELECT 1 FROM task t WHERE t.duty_id = o.duty_id AND t.period_key = p.period_key
                                             AND t.period_key = ANY(%(keys)s))
),
/* fragment: offered_tasks */,
inserted AS (
    /* fragment: insert_missing */
    ON CONFLICT ON CONSTRAINT task_dispatch_identity DO NOTHING
    RETURNING duty_id, period_key
),
newest AS (
    SELECT l.id AS duty_id, p.period_key, o.version, p.span_from, p.span_through
    FROM locked l
    JOIN offered_duty o ON o.duty_id = l.id
    JOIN offered_period p ON p.period_group = l.period_group AND p.period_index = l.last_index
),
marks AS (
    SELECT n.duty_id, greatest(d.last_dispatched_period, n.period_key) AS last_dispatched_period,
           CASE WHEN n.span_from IS NULL THEN d.complete_from
                WHEN CAST(CAST(d.xmin AS text) AS bigint) = n.version THEN n.span_from END AS complete_from,
           CASE WHEN n.span_from IS NULL THEN d.complete_through
                WHEN CAST(CAST(d.xmin AS text) AS bigint) = n.version THEN n.span_through END AS complete_through
    FROM newest n
    JOIN duty d ON d.id = n.duty_id AND d.frequency = %(frequency)s AND d.id BETWEEN %(first_id)s AND %(last_id)s
),
changing AS (
    SELECT m.* FROM marks m JOIN duty d ON d.id = m.duty_id
    WHERE (d.last_dispatched_period, d.complete_from, d.complete_through)
          IS DISTINCT FROM (m.last_dispatched_period, m.complete_from, m.complete_through)
),
movable AS MATERIALIZED (
    SELECT d.id FROM duty d
    WHERE d.id IN (SELECT duty_id FROM changing) AND d.frequency = %(frequency)s
      AND d.id BETWEEN %(first_id)s AND %(last_id)s
    FOR NO KEY UPDATE OF d SKIP LOCKED
),
advanced AS (
    UPDATE duty d
    /* fragment: marks_moved */
    FROM newest n
    WHERE d.id = n.duty_id AND d.id IN (SELECT id FROM movable)
      AND d.frequency = %(frequency)s AND d.id BETWEEN %(first_id)s AND %(last_id)s
    RETURNING d.id
)
SELECT i.duty_id, NULL AS period_key, count(*) AS created, NULL AS waiting FROM inserted i GROUP BY i.duty_id
UNION ALL
SELECT NULL, period_key, count(*), NULL FROM inserted GROUP BY period_key
UNION ALL
SELECT duty_id, period_key, 0, 'held' FROM held
UNION ALL
SELECT c.duty_id, c.last_dispatched_period, 0, 'deferred' FROM changing c
WHERE NOT EXISTS (SELECT 1 FROM advanced a WHERE a.id = c.duty_id);

-- name: pages_paused
-- Fails at once while a page of the frequency is being written, by any run; once taken,
-- no page of it begins until this transaction ends (hold_page_lock).
SELECT frequency FROM dispatch_page_lock WHERE frequency = %(frequency)s FOR UPDATE NOWAIT;

-- name: move_deferred_marks
-- The last_dispatched_period marks insert_careful deferred, moved where the duty row is
-- free now, and only forward, to a task that still exists. Returns the duties whose rows
-- are still held: insert_careful deferred their spans too (complete_from..through), which
-- only a later run can prove again.
WITH wanted AS (
    SELECT w.duty_id, w.period_key
    FROM unnest(%(duty_ids)s::bigint[], %(keys)s::text[]) AS w (duty_id, period_key)
),
movable AS MATERIALIZED (
    SELECT d.id FROM duty d
    WHERE d.id = ANY(%(duty_ids)s) AND d.frequency = %(frequency)s
    ORDER BY d.id
    FOR NO KEY UPDATE OF d SKIP LOCKED
),
advanced AS (
    UPDATE duty d SET last_dispatched_period = w.period_key
    FROM wanted w
    WHERE d.id = w.duty_id AND d.id IN (SELECT id FROM movable)
      AND (d.last_dispatched_period IS NULL OR d.last_dispatched_period < w.period_key)
      AND EXISTS (SELECT 1 FROM task t WHERE t.duty_id = w.duty_id AND t.period_key = w.period_key
                                         AND t.period_key = ANY(%(keys)s))
)
SELECT w.duty_id FROM wanted w
JOIN duty d ON d.id = w.duty_id AND d.frequency = %(frequency)s
WHERE NOT EXISTS (SELECT 1 FROM movable m WHERE m.id = w.duty_id);

-- name: advance_new
-- The bulk path, for a page whose every task lies after its duty's last_dispatched_period
-- (Plan.after_dispatched): none of them should exist, so nothing is asked of task. The
-- duties move first (their marks as in insert_new, from each duty's newest offered
-- period), and this UPDATE's row locks hold each of them, workspace included, until
-- commit: the foreign key's lock, taken once per duty (the page vouches for it,
-- page_settings). Their tasks then go in by copy_tasks, which PostgreSQL inserts a batch
-- at a time, with the workspace the page read: a duty moves only while its row still
-- has it. The writer counts the rows moved: a duty deleted, moved to another frequency
-- or workspace since the read moves none, and the page is written again by
-- insert_careful, which takes each duty as it stands. So does a task that exists after
-- all (a racing writer's, or one whose duty's marks a tenant's lock kept back), which
-- task_dispatch_identity refuses in the COPY. Nothing is returned: a million duties'
-- workspaces sent back and decoded cost 0.9 s of Python (docs/perf.md).
UPDATE duty d
/* fragment: marks_moved */
FROM (SELECT o.duty_id, o.workspace, p.period_key, o.version, p.span_from, p.span_through
      FROM offered_duty o
      JOIN offered_period p ON p.period_group = o.period_group AND p.period_index = o.last_index) n
WHERE d.id = n.duty_id AND d.frequency = %(frequency)s AND d.id BETWEEN %(first_id)s AND %(last_id)s
  AND d.workspace_id = n.workspace;

-- name: offer_only_free
-- A bulk page whose advance_new met a duty row another transaction holds, written again
-- around it: the page's duties nobody holds, still of the frequency and workspace the page
-- read, are locked now, as advance_new locks them, and stay on offer for the bulk path;
-- the others (a tenant's open UPDATE or FOR UPDATE, a duty deleted or moved since the
-- read) leave offered_duty and are returned, for insert_careful to write as they stand.
-- SKIP LOCKED waits on no tenant.
WITH free AS MATERIALIZED (
    SELECT d.id FROM duty d
    JOIN offered_duty o ON o.duty_id = d.id AND o.workspace = d.workspace_id
    WHERE d.frequency = %(frequency)s AND d.id BETWEEN %(first_id)s AND %(last_id)s
    FOR NO KEY UPDATE OF d SKIP LOCKED
)
DELETE FROM offered_duty o
WHERE NOT EXISTS (SELECT 1 FROM free f WHERE f.id = o.duty_id)
RETURNING o.duty_id;

-- name: advance_settings
-- The temporary tables have no statistics, so the planner expects a few hundred duties
-- and probes duty_pkey once for each of the page's duties. Without nested loops it reads
-- the page's id range of duty_dispatch_scan_idx once and hashes (docs/perf.md), in
-- advance_new and in offer_only_free.
SELECT set_config('enable_nestloop', 'off', true);

-- name: copy_tasks
-- The bulk path's rows, written by writing.py's _copy_tasks.
COPY task (duty_id, workspace_id, period_key, period_start, due_date, visible_from) FROM STDIN (FORMAT BINARY);

-- name: ensure_partitions
-- The page's partitions exist before its insert routes rows to them; the function locks
-- task only when one is missing (the first night of a range, a backfill), in the mode
-- ATTACH PARTITION takes, which nothing a tenant may do conflicts with.
SELECT rota_ensure_task_partitions(%s::text[]);

-- name: missing_offered
-- How many duties of a page lack some offered task, read without a transaction that could
-- write. A duty's offered tasks are one contiguous run of its frequency's periods
-- (planner.Slice), and every task of a duty has the duty's frequency: the tasks between
-- the run's first and last key are offered ones, and the run is whole when they number
-- its length.
SELECT count(*)
FROM unnest(%(duty_ids)s::bigint[], %(first_keys)s::text[], %(last_keys)s::text[], %(sizes)s::int[])
     AS o (duty_id, first_key, last_key, size)
WHERE o.size <> (SELECT count(*) FROM task t
                 WHERE t.duty_id = o.duty_id AND t.period_key BETWEEN o.first_key AND o.last_key
                   AND t.period_key = ANY(%(keys)s));

-- name: max_lead
-- The longest lead of an active recurring duty of the frequency: how far past the periods
-- begun somewhere on Earth a scheduled run dispatches.
SELECT coalesce(max(lead_days), 0) FROM duty WHERE frequency = %s AND kind = 'recurring' AND state = 'active';

-- name: id_range
SELECT min(id), max(id) FROM duty WHERE frequency = %s;

-- name: gaps_answered
-- What either check below answers, its gaps standing in for /* gaps */: the first few
-- (duty, period) pairs, held ones first, with the counts of both kinds, and on every row
-- how many gaps each period has, apart and held: the periods a run may not report done.
WITH gaps AS MATERIALIZED (/* gaps */)
SELECT g.id, g.period_key, count(*) OVER (), count(*) FILTER (WHERE g.held) OVER (),
       (SELECT json_object_agg(period_key, n) FROM (SELECT period_key, count(*) AS n FROM gaps
                                                     WHERE NOT held GROUP BY period_key) k),
       (SELECT json_object_agg(period_key, n) FROM (SELECT period_key, count(*) AS n FROM gaps
                                                     WHERE held GROUP BY period_key) k)
FROM gaps g
ORDER BY g.held DESC, g.id, g.period_key
LIMIT %(shown)s;

-- fragment: judged_duties
-- The duties a check judges, in the part's id range (find_gaps splits by id): eligible
-- duties with a today, eligible already at the instant judged.
WHERE d.frequency = %(frequency)s AND d.kind = 'recurring' AND d.state = 'active' AND z.today IS NOT NULL
  AND d.eligible_since <= %(as_of)s AND d.id BETWEEN %(lo)s AND %(hi)s;

-- name: scheduled_gaps
-- The completeness check after a scheduled run at %(as_of)s, over one duty id range: every
-- eligible duty (active, recurring, of the frequency, with a today) whose today lies in
-- its window has its current period, unless that period is due outside the window or
-- lies outside the run's range (first_key..last_key). A duty that became eligible after
-- the instant judged owed nothing to it. One probe of task_dispatch_identity per (duty,
-- period), whatever the statistics say: as an anti-join, the planner trusted a partition
-- analyzed before a dispatch filled it and compared every duty with all of it (minutes:
-- docs/perf.md). A LATERAL with a LIMIT is never flattened into a join, so its scan runs
-- once per row and only an index lookup is cheap enough to be chosen. Each probe also
-- names the run's keys as constants, which prune it to the partitions that can hold them.
-- The duties the run found held by another transaction (%(held)s) come first and are
-- counted apart: their gaps are known and waiting, not lost. The caller's LIMIT leaves room
-- for every held pair before the first others (gaps_answered).
SELECT d.id, c.period_key, d.id = ANY(CAST(%(held)s AS bigint[])) AS held
FROM duty d
/* fragment: zone_today */
CROSS JOIN LATERAL (
    SELECT to_char(s.start, %(key_format)s) AS period_key,
           CAST(s.start + CAST(%(step)s AS interval) - interval '1 day' AS date) AS due_date
    FROM (SELECT date_trunc(%(unit)s, CAST(z.today AS timestamp)) AS start) s
) c
LEFT JOIN LATERAL (
    SELECT 1 AS one FROM task t
    WHERE t.duty_id = d.id AND t.period_key = c.period_key AND t.period_key BETWEEN %(first_key)s AND %(last_key)s
    LIMIT 1
) found ON true
/* fragment: judged_duties */
  AND (d.effective_from IS NULL OR d.effective_from <= z.today)
  AND (d.effective_to IS NULL OR z.today <= d.effective_to)
  AND (d.effective_from IS NULL OR d.effective_from <= c.due_date)
  AND (d.effective_to IS NULL OR c.due_date <= d.effective_to)
  AND c.period_key BETWEEN %(first_key)s AND %(last_key)s
  AND found.one IS NULL;

-- name: backfill_gaps
-- The completeness check after a backfill of the requested periods (keys, starts, dues)
-- at %(as_of)s: every requested period of every eligible duty, due inside the duty's
-- window, that a scheduled run at as_of would reach (its start or its visible_from on or
-- before the duty's today). Probed as in scheduled_gaps, answered by gaps_answered.
SELECT d.id, p.period_key, d.id = ANY(CAST(%(held)s AS bigint[])) AS held
FROM duty d
/* fragment: zone_today */
CROSS JOIN unnest(CAST(%(keys)s AS text[]), CAST(%(starts)s AS date[]), CAST(%(dues)s AS date[]))
    AS p(period_key, period_start, due_date)
LEFT JOIN LATERAL (
    SELECT 1 AS one FROM task t
    WHERE t.duty_id = d.id AND t.period_key = p.period_key AND t.period_key = ANY(%(keys)s)
    LIMIT 1
) found ON true
/* fragment: judged_duties */
  AND (d.effective_from IS NULL OR d.effective_from <= p.due_date)
  AND (d.effective_to IS NULL OR p.due_date <= d.effective_to)
  AND (p.period_start <= z.today OR p.due_date - d.lead_days <= z.today)
  AND found.one IS NULL;
