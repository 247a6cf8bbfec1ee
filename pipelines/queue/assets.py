"""The queue's asset: scheduled runs (one hourly partition per hour of cron fire times),
with its check that every fire time is queued."""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    MaterializeResult,
    MetadataValue,
    asset,
)
from sqlalchemy import ARRAY, BigInteger, DateTime, bindparam, text

from rota.pipelines.periods.as_of import AsOfConfig, run_instant
from rota.pipelines.periods.partitions import HOURLY, SINGLE_RUN
from rota.pipelines.queue.enqueue import enqueue_scheduled_many
from rota.pipelines.queue.jobs import cancel_unscheduled_runs
from rota.pipelines.queue.scheduling import ScheduledJob, plan_fire_times
from rota.resources.postgres import PostgresResource
from rota.resources.scheduling import SchedulingSettings
from rota.resources.database.queries import queries

QUERIES = queries("rota.pipelines.queue")

LIVE_TAG = "rota/live"
SCHEDULED_RUNS = "scheduled_runs"
FIRE_TIMES_CHECK = "every_fire_time_is_queued"


_SCHEDULED_JOBS = text(QUERIES["scheduled_jobs"])
_MISSING_RUNS = text(QUERIES["missing_runs"]).bindparams(bindparam("job_ids", type_=ARRAY(BigInteger)),
             bindparam("fire_times", type_=ARRAY(DateTime(timezone=True))))


@asset(
    name=SCHEDULED_RUNS,
    partitions_def=HOURLY,
    backfill_policy=SINGLE_RUN,
    check_specs=[AssetCheckSpec(FIRE_TIMES_CHECK, asset=SCHEDULED_RUNS,
                                description="every fire time of the hour has its run in job_queue")],
    group_name="queue",
    kinds={"postgres"},
    description="One queued run per enabled cron job and fire time (UTC hours; each job's cron "
                "is read in its own timezone). A missing hour is a tick nobody delivered: "
                "backfill it by selecting its range.",
)
def scheduled_runs(context: AssetExecutionContext, config: AsOfConfig, database: PostgresResource,
                   scheduling: SchedulingSettings) -> MaterializeResult:
    as_of = run_instant(config)
    live = context.run.tags.get(LIVE_TAG) == "true"
    window = context.partition_time_window
    engine = database.engine()
    with engine.connect() as conn:
        jobs = [ScheduledJob(*row) for row in conn.execute(_SCHEDULED_JOBS)]
    plan = plan_fire_times(jobs, window.start, window.end, as_of=as_of,
                           catch_up=scheduling.catch_up if live else None)
    created = enqueue_scheduled_many(engine, plan.due)
    # An operator's edit of a cron reaches rota here (the sensor re-materialises the live
    # hours when the jobs change): queued runs of fire times gone from it are cancelled.
    cancelled = cancel_unscheduled_runs(engine)
    every = plan.due + plan.stale
    with engine.connect() as conn:
        missing = conn.execute(_MISSING_RUNS, {"job_ids": [j for j, _ in every],
                                               "fire_times": [t for _, t in every]}).scalar_one()
    # A job whose cron cannot be planned (written past register_job, which refuses it) is
    # reported on this hour's check, at ERROR; it never stops the other jobs' fire times.
    unplannable = "; ".join(f"job {j}: {why}" for j, why in sorted(plan.unplannable.items()))
    if unplannable:
        context.log.error("%d jobs could not be planned (every other job was enqueued): %s",
                          len(plan.unplannable), unplannable)
    context.log.info("%s %s..%s: %d fire times, %d created, %d stale, %d cancelled", "live" if live else "backfill",
                     window.start.isoformat(), window.end.isoformat(), len(every), len(created), len(plan.stale),
                     cancelled)
    return MaterializeResult(
        metadata={
            "mode": "live" if live else "backfill",
            "as_of": as_of.isoformat(),
            "jobs": len(jobs),
            "fire_times": len(every),
            "created": len(created),
            "existing": len(plan.due) - len(created),
            "stale_not_queued": len(plan.stale),
            "cancelled_no_longer_scheduled": cancelled,
        },
        check_results=[AssetCheckResult(
            check_name=FIRE_TIMES_CHECK,
            passed=missing == 0 and not unplannable,
            severity=AssetCheckSeverity.ERROR if unplannable else AssetCheckSeverity.WARN,
            metadata={"missing": missing, "stale_not_queued": len(plan.stale),
                      "unplannable_jobs": MetadataValue.text(unplannable or "none"),
                      "what_to_do": MetadataValue.text(_what_to_do(missing, unplannable))},
        )],
    )


def _what_to_do(missing: int, unplannable: str) -> str:
    steps = []
    if unplannable:
        steps.append("fix or disable the jobs named in unplannable_jobs (UPDATE job SET schedule = ... or "
                     "enabled = false), then backfill this partition")
    if missing:
        steps.append("backfill this partition to queue the fire times live delivery skipped")
    return "; ".join(steps) or "nothing"


QUEUE_ASSETS = [scheduled_runs]
