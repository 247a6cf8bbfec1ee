"""The job queue in the Dagster UI (SPEC §6): the asset `job_queue`, whose materialisations
`job_queue_sensor` reports every minute with the state per job as numbers Dagster plots
over time and the failed runs with their errors; its check `no_failed_or_waiting_runs`;
and the job `operate_job_queue`, whose launchpad config names the runs to retry or
cancel. The rules live in pipelines.queue.operations, free of Dagster."""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetSpec,
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    asset_check,
    job,
    op,
)

from rota.pipelines.queue.operations import NotActionable, QueueState, operate, read_queue_state
from rota.resources.postgres import PostgresResource
from rota.resources.scheduling import SchedulingSettings

JOB_QUEUE = "job_queue"
QUEUE_HEALTH_CHECK = "no_failed_or_waiting_runs"
_PER_JOB = ("queued", "running", "failed_last_day", "oldest_waiting_seconds", "claim_latency_p95_seconds")
# A job's claim latency when no run of the last hour has started: said, not left out, so a
# fresh install shows every key the description promises. The Plots tab skips a text.
NO_CLAIM_LATENCY = "none: no run that fell due in the last hour has started"

job_queue_asset = AssetSpec(
    JOB_QUEUE, group_name="queue", kinds={"postgres"},
    description="The queue of handler runs, reported every minute by job_queue_sensor: per job, runs queued, "
                "running and failed in the last day, the oldest due run's wait, and the claim latency (p95 "
                "over the last hour, from falling due to starting; none while no such run has started); the "
                "Plots tab shows each over time. Retry a failed run or cancel a queued one with the job "
                "operate_job_queue.")


def _cell(error: str | None, limit: int = 300) -> str:
    """An error on one table line: a traceback by its last line, the exception itself."""
    lines = [line for line in (error or "").splitlines() if line.strip()]
    text = lines[-1] if lines and lines[0].startswith("Traceback") else " ".join(lines)
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def queue_metadata(state: QueueState) -> dict:
    metadata = {name: state.total(name) for name in ("queued", "due", "running", "failed_last_day")}
    metadata["oldest_waiting_seconds"] = round(state.oldest_waiting_seconds, 1)
    for job_state in state.jobs:
        for name in _PER_JOB:
            value = getattr(job_state, name)
            if value is None:
                value = MetadataValue.text(NO_CLAIM_LATENCY)
            elif isinstance(value, float):
                value = round(value, 3)
            metadata[f"{job_state.job}: {name}"] = value
    failures = ["| run | job | attempts | failed at | error |", "|---|---|---|---|---|"]
    failures += [f"| {f.run_id} | {f.job} | {f.attempts} | {f.finished_at:%Y-%m-%d %H:%M:%S %Z} | {_cell(f.error)} |"
                 for f in state.failures]
    metadata["failed_runs"] = MetadataValue.md("\n".join(failures) if state.failures else "none in the last day")
    return metadata


def queue_health(state: QueueState, max_wait_seconds: int) -> dict:
    """The check's verdict as keyword arguments of an AssetCheckResult (or Evaluation):
    failed when a run failed in the last hour or a due run waits past the limit."""
    problems = []
    failed = sum(job.failed_last_hour for job in state.jobs)
    if failed:
        shown = ", ".join(f"run {f.run_id} ({f.job}): {_cell(f.error, 120)}" for f in state.failures[:3])
        problems.append(f"{failed} runs failed in the last hour: {shown}")
    if state.oldest_waiting_seconds > max_wait_seconds:
        waiting = [f"{job.job} {job.oldest_waiting_seconds:.0f} s" for job in state.jobs
                   if job.oldest_waiting_seconds > max_wait_seconds]
        problems.append(f"due runs waiting longer than {max_wait_seconds} s: {', '.join(waiting)} "
                        f"(are workers running?)")
    return dict(passed=not problems, severity=AssetCheckSeverity.ERROR,
                description="; ".join(problems) or None,
                metadata={"failed_last_hour": failed, "oldest_waiting_seconds": round(state.oldest_waiting_seconds, 1),
                          "max_wait_seconds": max_wait_seconds})


@asset_check(asset=JOB_QUEUE, name=QUEUE_HEALTH_CHECK, blocking=False,
             description="No run failed in the last hour and no due run waits longer than ROTA_QUEUE_MAX_WAIT_SECONDS "
                         f"(default {SchedulingSettings().max_wait_seconds}). Evaluated every minute by "
                         "job_queue_sensor.")
def queue_health_check(_: AssetCheckExecutionContext, database: PostgresResource,
                       scheduling: SchedulingSettings) -> AssetCheckResult:
    return AssetCheckResult(**queue_health(read_queue_state(database.engine()), scheduling.max_wait_seconds))


class QueueActionConfig(Config):
    retry: list[int] = []
    """Ids of failed runs to queue again, now, with a fresh budget of attempts."""
    cancel: list[int] = []
    """Ids of queued runs to cancel."""


@op(name="runs")
def runs_op(context: OpExecutionContext, config: QueueActionConfig, database: PostgresResource) -> None:
    try:
        done = operate(database.engine(), retry=config.retry, cancel=config.cancel, by=context.run_id)
    except NotActionable as refused:
        raise Failure(description=f"refused: {refused}") from None
    context.log.info("retried %s; cancelled %s (recorded on each run as by Dagster run %s)",
                     done.retried or "none", done.cancelled or "none", context.run_id)
    context.add_output_metadata({"retried": MetadataValue.json(done.retried),
                                 "cancelled": MetadataValue.json(done.cancelled)})


@job(name="operate_job_queue",
     description="Retry failed runs or cancel queued ones: in the launchpad, name their ids in "
                 "ops.runs.config.retry and .cancel. All or nothing: a run that does not "
                 "exist or is not in the state its action needs fails this run, naming it, and nothing "
                 "changes. Each row records the action, when, and this run's id.")
def operate_job_queue():
    runs_op()
