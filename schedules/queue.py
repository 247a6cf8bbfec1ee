"""Sensors that keep the job queue flowing (live delivery of cron fire times, event
dispatch) and show it in the UI (job_queue_sensor)."""

from datetime import datetime, timezone

from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    sensor,
)
from sqlalchemy import text

from rota.pipelines.queue.assets import HOURLY, LIVE_TAG, SCHEDULED_RUNS
from rota.pipelines.queue.events import dispatch_pending_events
from rota.pipelines.queue.operations import read_queue_state
from rota.pipelines.queue.scheduling import live_hours
from rota.pipelines.queue.view import (
    JOB_QUEUE,
    QUEUE_HEALTH_CHECK,
    operate_job_queue,
    queue_health,
    queue_metadata,
)
from rota.resources.postgres import PostgresResource
from rota.resources.scheduling import SchedulingSettings
from rota.resources.database.queries import queries

QUERIES = queries("rota.schedules")

_JOBS_FINGERPRINT = text(QUERIES["jobs_fingerprint"])


deliver_scheduled_runs_job = define_asset_job(
    "deliver_scheduled_runs", selection=[SCHEDULED_RUNS],
    description="Queues the cron fire times of the selected hours.")


@sensor(
    name="scheduled_runs_sensor",
    job=deliver_scheduled_runs_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Live delivery: queues each hour's fire times ahead of the hour "
                "(run_at = scheduled_for), and again whenever the cron jobs change.",
)
def scheduled_runs_sensor(context: SensorEvaluationContext, database: PostgresResource,
                          scheduling: SchedulingSettings):
    now = datetime.now(timezone.utc)
    with database.engine().connect() as conn:
        fingerprint = conn.execute(_JOBS_FINGERPRINT).scalar_one()
    for hour in live_hours(now, scheduling.catch_up, scheduling.lookahead):
        key = HOURLY.get_partition_key_for_timestamp(hour.timestamp())
        if not HOURLY.has_partition_key(key):
            continue  # before rota's history starts
        yield RunRequest(
            run_key=f"{key}|{fingerprint}",
            partition_key=key,
            run_config={"ops": {SCHEDULED_RUNS: {"config": {"as_of": now.isoformat()}}}},
            tags={LIVE_TAG: "true"},
        )


@sensor(
    name="event_dispatch_sensor",
    minimum_interval_seconds=15,
    default_status=DefaultSensorStatus.RUNNING,
    description="Queues one run per new event and subscribed job, and marks the event "
                "delivered (event.dispatched_at) in the same statement: every committed event "
                "is delivered once, however long its transaction stayed open.",
)
def event_dispatch_sensor(context: SensorEvaluationContext, database: PostgresResource):
    delivered, created = dispatch_pending_events(database.engine())
    return SkipReason(f"delivered {delivered} events, queued {created} runs")


@sensor(
    name="job_queue_sensor",
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Every minute, reports the job queue's state per job as a materialisation of job_queue "
                "(no run: numbers Dagster plots) and evaluates its check no_failed_or_waiting_runs.",
)
def job_queue_sensor(context: SensorEvaluationContext, database: PostgresResource,
                     scheduling: SchedulingSettings) -> SensorResult:
    state = read_queue_state(database.engine())
    return SensorResult(asset_events=[
        AssetMaterialization(asset_key=JOB_QUEUE, metadata=queue_metadata(state)),
        AssetCheckEvaluation(asset_key=AssetKey(JOB_QUEUE), check_name=QUEUE_HEALTH_CHECK,
                             **queue_health(state, scheduling.max_wait_seconds)),
    ])


QUEUE_JOBS = [deliver_scheduled_runs_job, operate_job_queue]
QUEUE_SENSORS = [scheduled_runs_sensor, event_dispatch_sensor, job_queue_sensor]
