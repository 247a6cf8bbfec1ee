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
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.sources")

log = logging.getLogger(__name__)


def nightly_ref(day: date) -> str:
    return f"nightly/{day.isoformat()}"


NIGHTLY = Source(name="nightly", job_name="nightly-maintenance", ref_convention="nightly/YYYY-MM-DD",
                 ref=nightly_ref)
COMPACT_BATCH = 10_000


_COMPACT = text(QUERIES["compact"])


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
        conn.execute(text(QUERIES["analyze"]))
    log.info("nightly maintenance %s: reclaimed %s, compacted %d finished runs older than %d days, analyzed the "
             "tenant and queue tables", run.source_ref, reclaimed, compacted, settings.retention_days)
