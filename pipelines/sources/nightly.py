"""The nightly maintenance Source: one run per night, because the date is in its ref.

Ref convention: `nightly/YYYY-MM-DD`, the UTC day the partition covers. Its handler does
the queue's upkeep: reclaims expired leases, compacts finished runs older than the
retention to their identity, and refreshes the planner's statistics."""

import logging
from datetime import date

from sqlalchemy import Engine, text

from rota.pipelines.queue.claims import ClaimedRun, reclaim_expired
from rota.pipelines.queue.handlers import handler
from rota.pipelines.sources import Source
from rota.resources.maintenance import MaintenanceSettings, maintenance_settings_from_env

log = logging.getLogger(__name__)


def nightly_ref(day: date) -> str:
    return f"nightly/{day.isoformat()}"


NIGHTLY = Source(name="nightly", job_name="nightly-maintenance", ref_convention="nightly/YYYY-MM-DD",
                 ref=nightly_ref)
COMPACT_BATCH = 10_000
TENANT_AND_QUEUE_TABLES = ("duty", "task", "job", "event", "job_queue")


# A finished run past the retention keeps its row, and with it its identity (schedule,
# event or source ref): only the payload and the error text go. Deleting the row would let
# a backfill or a replayed cursor produce the same run again.
_COMPACT = text(
    """
    WITH done AS (
        SELECT id FROM job_queue
        WHERE state IN ('succeeded', 'failed', 'cancelled')
          AND finished_at < now() - make_interval(days => :days)
          AND (payload <> '{}'::jsonb OR last_error IS NOT NULL)
        ORDER BY id
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    UPDATE job_queue q SET payload = '{}'::jsonb, last_error = NULL
    FROM done WHERE q.id = done.id
    """
)


def compact_finished_runs(engine: Engine, settings: MaintenanceSettings) -> int:
    """Drop the payload and error text of finished runs older than the retention, in
    batches, keeping each run's identity; returns how many runs were compacted."""
    compacted = 0
    while True:
        with engine.begin() as conn:
            changed = conn.execute(_COMPACT, {"days": settings.retention_days, "batch": COMPACT_BATCH}).rowcount
        compacted += changed
        if changed < COMPACT_BATCH:
            return compacted


@handler(NIGHTLY.job_name)
def run_maintenance(run: ClaimedRun, engine: Engine) -> None:
    settings = maintenance_settings_from_env()
    reclaimed = reclaim_expired(engine)
    compacted = compact_finished_runs(engine, settings)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in TENANT_AND_QUEUE_TABLES:
            conn.execute(text(f"ANALYZE {table}"))
    log.info("nightly maintenance %s: reclaimed %s, compacted %d finished runs older than %d days, analyzed %s",
             run.source_ref, reclaimed, compacted, settings.retention_days, ", ".join(TENANT_AND_QUEUE_TABLES))
