"""The nightly maintenance Source: one run per night, because the date is in its ref.

Ref convention: `nightly/YYYY-MM-DD`, the UTC day the partition covers. Its handler does
the queue's upkeep: reclaims expired leases, prunes finished runs older than the
retention, and refreshes the planner's statistics."""

import logging
from datetime import date, datetime, timezone

from dagster import (
    AssetExecutionContext,
    DailyPartitionsDefinition,
    Failure,
    MaterializeResult,
    asset,
)
from sqlalchemy import Engine, text

from pipelines.handlers import handler
from pipelines.partitions import SINGLE_RUN
from pipelines.queue import ClaimedRun, produce_many, reclaim_expired, register_job
from pipelines.sources import Source
from resources.maintenance import MaintenanceSettings, maintenance_settings_from_env
from resources.postgres import PostgresResource

log = logging.getLogger(__name__)


def nightly_ref(day: date) -> str:
    return f"nightly/{day.isoformat()}"


NIGHTLY = Source(name="nightly", job_name="nightly-maintenance", ref_convention="nightly/YYYY-MM-DD",
                 ref=nightly_ref)
NIGHTLY_PARTITIONS = DailyPartitionsDefinition(start_date="2025-01-01")
PRUNE_BATCH = 10_000
TENANT_AND_QUEUE_TABLES = ("duty", "task", "job", "event", "job_queue")


@asset(
    name="nightly_maintenance",
    partitions_def=NIGHTLY_PARTITIONS,
    backfill_policy=SINGLE_RUN,
    group_name="queue",
    kinds={"postgres"},
    description="One nightly-maintenance run per day (ref nightly/YYYY-MM-DD). Backfill by "
                "selecting days; a day already produced is left alone.",
)
def nightly_maintenance(context: AssetExecutionContext, database: PostgresResource,
                        maintenance: MaintenanceSettings) -> MaterializeResult:
    days = [date.fromisoformat(key) for key in context.partition_keys]
    oldest = maintenance.oldest_backfill(datetime.now(timezone.utc)).date()
    too_old = [d.isoformat() for d in days if d < oldest]
    if too_old:
        raise Failure(description=(
            f"{len(too_old)} days lie beyond the backfill horizon ({maintenance.backfill_horizon_days} "
            f"days, oldest allowed {oldest}): {too_old[0]}..{too_old[-1]}. Their runs may already "
            "have been pruned, so producing them again could run them twice."))
    engine = database.engine()
    register_job(engine, NIGHTLY.job_name)
    produced = produce_many(engine, NIGHTLY.name,
                            [(NIGHTLY.ref(d), NIGHTLY.job_name, {"date": d.isoformat()}) for d in days])
    return MaterializeResult(metadata={
        "days": len(days),
        "created": produced.count("created"),
        "refreshed": produced.count("refreshed"),
        "unchanged": produced.count("unchanged"),
    })


_PRUNE = text(
    """
    WITH doomed AS (
        SELECT id FROM job_queue
        WHERE state IN ('succeeded', 'failed', 'cancelled')
          AND finished_at < now() - make_interval(days => :days)
        ORDER BY id
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM job_queue q USING doomed WHERE q.id = doomed.id
    """
)


def prune_finished_runs(engine: Engine, settings: MaintenanceSettings) -> int:
    """Delete finished runs older than the retention, in batches; returns how many."""
    pruned = 0
    while True:
        with engine.begin() as conn:
            deleted = conn.execute(_PRUNE, {"days": settings.retention_days, "batch": PRUNE_BATCH}).rowcount
        pruned += deleted
        if deleted < PRUNE_BATCH:
            return pruned


@handler(NIGHTLY.job_name)
def run_maintenance(run: ClaimedRun, engine: Engine) -> None:
    settings = maintenance_settings_from_env()
    reclaimed = reclaim_expired(engine)
    pruned = prune_finished_runs(engine, settings)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in TENANT_AND_QUEUE_TABLES:
            conn.execute(text(f"ANALYZE {table}"))
    log.info("nightly maintenance %s: reclaimed %s, pruned %d finished runs older than %d days, analyzed %s",
             run.source_ref, reclaimed, pruned, settings.retention_days, ", ".join(TENANT_AND_QUEUE_TABLES))
