"""The job queue operated in Dagster (SPEC §6): its state per job as job_queue_sensor
reports it, the health check and its webhook alert, and retrying or cancelling runs
through the job operate_job_queue, all or nothing, recorded on each row."""

import threading
from datetime import datetime, timedelta, timezone

import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, build_sensor_context
from sqlalchemy import text

from rota.pipelines.definitions import defs
from rota.pipelines.queue.claims import fail
from rota.pipelines.queue.enqueue import enqueue_scheduled
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.operations import NotActionable, operate
from rota.pipelines.queue.view import JOB_QUEUE, NO_CLAIM_LATENCY, QUEUE_HEALTH_CHECK
from rota.resources.alerts import AlertWebhookResource
from rota.resources.scheduling import SchedulingSettings
from tests.helpers import claim_due_runs, outcome_once_released
from tests.dagster.test_alerts import webhook

LEASE = timedelta(seconds=60)


def _queued(engine, job_id, *minutes_ago):
    now = datetime.now(timezone.utc).replace(microsecond=0)
    return [enqueue_scheduled(engine, job_id, now - timedelta(minutes=m)).run_id for m in minutes_ago]


def _row(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(text("SELECT state, attempts, run_at, finished_at, last_error, operator_action, "
                                 "operator_action_at, operator_run_id, started_at FROM job_queue WHERE id = :id"),
                            {"id": run_id}).mappings().one()


def _failed_run(engine, job_id, error="boom: the handler raised"):
    [run_id] = _queued(engine, job_id, 30)
    claimed = claim_due_runs(engine, "w1", 10, LEASE)
    assert [c.id for c in claimed] == [run_id]
    assert fail(engine, run_id, "w1", error, backoff=timedelta(0), cap=timedelta(0)) == "failed"
    return run_id


def _sense(instance):
    sensor = defs.resolve_sensor_def("job_queue_sensor")
    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        return sensor.evaluate_tick(context)


def test_the_sensor_reports_each_jobs_state_and_the_failed_runs_with_their_errors(engine):
    mail = register_job(engine, "mail", max_attempts=1)
    report = register_job(engine, "report", max_attempts=1)
    register_job(engine, "idle")  # no run yet, as every job on a fresh install
    failed = _failed_run(engine, mail, "SMTP 550: mailbox unavailable")
    _queued(engine, report, 12, 2)  # due for twelve minutes and for two
    enqueue_scheduled(engine, report, datetime.now(timezone.utc) + timedelta(hours=2))  # queued, not due
    [running] = claim_due_runs(engine, "w2", 1, LEASE)  # the longest-waiting report run
    assert _row(engine, running.id)["started_at"] is not None

    instance = DagsterInstance.ephemeral()
    result = _sense(instance)
    [materialization] = [e for e in result.asset_events if e.__class__.__name__ == "AssetMaterialization"]
    metadata = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    assert (metadata["queued"], metadata["due"], metadata["running"], metadata["failed_last_day"]) == (2, 1, 1, 1)
    assert (metadata["mail: failed_last_day"], metadata["report: queued"], metadata["report: running"]) == (1, 2, 1)
    assert 110 <= metadata["report: oldest_waiting_seconds"] <= 200  # the run due two minutes ago
    assert metadata["report: claim_latency_p95_seconds"] >= 600  # claimed twelve minutes after it fell due
    # Every key the asset's description promises is there before any run was claimed.
    assert {key for key in metadata if key.startswith("idle: ")} == {
        f"idle: {name}" for name in ("queued", "running", "failed_last_day", "oldest_waiting_seconds",
                                     "claim_latency_p95_seconds")}
    assert metadata["idle: claim_latency_p95_seconds"] == NO_CLAIM_LATENCY
    assert f"| {failed} | mail | 1 |" in metadata["failed_runs"] and "SMTP 550" in metadata["failed_runs"]

    [evaluation] = [e for e in result.asset_events if e.__class__.__name__ == "AssetCheckEvaluation"]
    assert not evaluation.passed and f"run {failed} (mail): SMTP 550" in evaluation.description


def test_a_due_run_waiting_past_the_limit_fails_the_check_and_the_webhook_hears_it_once(engine, webhook):  # noqa: F811
    job_id = register_job(engine, "slow")
    instance = DagsterInstance.ephemeral()
    resources = {**defs.resources, "alerts": AlertWebhookResource(url=webhook.url),
                 "scheduling": SchedulingSettings(max_wait_seconds=300)}
    alert = defs.resolve_sensor_def("check_failure_alert_sensor")
    queue = defs.resolve_sensor_def("job_queue_sensor")

    def tick(sensor, cursor=None):
        with build_sensor_context(instance=instance, resources=resources, cursor=cursor,
                                  repository_def=defs.get_repository_def()) as context:
            result = sensor.evaluate_tick(context)
        for event in result.asset_events:
            instance.report_runless_asset_event(event)
        return result.cursor

    _queued(engine, job_id, 4)
    cursor = tick(alert, tick(queue))
    assert webhook.received == []  # four minutes is within the limit
    _queued(engine, job_id, 9)
    tick(queue)
    key = AssetCheckKey(AssetKey(JOB_QUEUE), QUEUE_HEALTH_CHECK)
    assert instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key].status.value == "FAILED"
    cursor = tick(alert, cursor)
    tick(queue)
    cursor = tick(alert, cursor)
    assert [m["check"] for m in webhook.received] == [QUEUE_HEALTH_CHECK]  # once per turn, not per evaluation
    assert "waiting longer than 300 s: slow" in webhook.received[0]["text"]


def _launch(retry=(), cancel=()):
    job = defs.resolve_job_def("operate_job_queue")
    return job.execute_in_process(
        instance=DagsterInstance.ephemeral(), raise_on_error=False,
        run_config={"ops": {"runs": {"config": {"retry": list(retry), "cancel": list(cancel)}}}})


def test_an_operator_retries_a_failed_run_and_cancels_a_queued_one_from_the_launchpad(engine):
    job_id = register_job(engine, "mail", max_attempts=1)
    failed = _failed_run(engine, job_id)
    [queued] = _queued(engine, job_id, -60)  # due in an hour
    result = _launch(retry=[failed], cancel=[queued])
    assert result.success
    retried, cancelled = _row(engine, failed), _row(engine, queued)
    assert (retried["state"], retried["attempts"], retried["finished_at"]) == ("queued", 0, None)
    assert retried["last_error"] == "boom: the handler raised"  # kept until the next attempt writes its own
    assert (retried["operator_action"], retried["operator_run_id"]) == ("retried", result.run_id)
    assert (cancelled["state"], cancelled["operator_action"], cancelled["operator_run_id"]) == (
        "cancelled", "cancelled", result.run_id)
    assert result.run_id in cancelled["last_error"] and cancelled["operator_action_at"] is not None
    # The retried run is claimed again, with its job's whole budget of attempts.
    assert [c.id for c in claim_due_runs(engine, "w3", 10, LEASE)] == [failed]


def test_an_action_on_a_run_it_does_not_apply_to_changes_nothing_and_names_every_such_run(engine):
    job_id = register_job(engine, "mail", max_attempts=1)
    failed = _failed_run(engine, job_id)
    [queued] = _queued(engine, job_id, -60)
    before = [dict(_row(engine, run_id)) for run_id in (failed, queued)]
    result = _launch(retry=[failed, queued], cancel=[failed, 999_999])
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.error.message + str(failure.event_specific_data.user_failure_data)
    assert f"runs [{failed}] are named both" in message
    result = _launch(retry=[failed, queued], cancel=[999_999])
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    description = failure.event_specific_data.user_failure_data.description
    assert f"run {queued} is queued, not failed (retry)" in description
    assert "run 999999 does not exist (cancel)" in description
    assert [dict(_row(engine, run_id)) for run_id in (failed, queued)] == before


def test_a_cancel_that_meets_a_claim_in_flight_waits_for_it_and_refuses_whole(engine):
    """A worker has claimed some of the runs and not committed yet: the cancel waits for
    its locks, then sees them running and refuses, naming them, cancelling none. (Read
    without a lock, it saw them queued and cancelled only the rest.)"""
    job_id = register_job(engine, "race")
    runs = _queued(engine, job_id, *range(1, 11))
    with engine.connect() as worker:
        worker.begin()
        claimed = {c.id for c in claim_due_runs(worker, "racer", 4, LEASE)}
        outcome = outcome_once_released(engine, worker, "the cancel",
                                        lambda: operate(engine, retry=[], cancel=runs, by="test").cancelled,
                                        refused=NotActionable)
    assert "result" not in outcome, outcome
    assert all(f"run {r} is running, not queued (cancel)" in outcome["error"] for r in claimed)
    with engine.connect() as conn:
        states = dict(conn.execute(text("SELECT id, state FROM job_queue WHERE id = ANY(:ids)"), {"ids": runs}).all())
    assert {r for r, s in states.items() if s == "running"} == claimed
    assert {r for r, s in states.items() if s == "queued"} == set(runs) - claimed


def test_cancels_and_claims_at_once_never_take_the_same_run(engine):
    job_id = register_job(engine, "race")
    runs = _queued(engine, job_id, *range(1, 41))
    outcome = {"cancelled": set()}
    start = threading.Barrier(2)

    def claim():
        start.wait()
        outcome["claimed"] = {c.id for c in claim_due_runs(engine, "racer", 40, LEASE)}

    def cancel():
        start.wait()
        for run_id in runs:
            try:
                outcome["cancelled"] |= set(operate(engine, retry=[], cancel=[run_id], by="test").cancelled)
            except NotActionable:
                pass

    threads = [threading.Thread(target=claim), threading.Thread(target=cancel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not outcome["claimed"] & outcome["cancelled"]
    assert outcome["claimed"] | outcome["cancelled"] == set(runs)


@pytest.mark.parametrize("column, value", [("operator_action", "'deleted'"), ("operator_run_id", "NULL")])
def test_an_operator_action_is_recorded_whole(engine, column, value):
    job_id = register_job(engine, "mail", max_attempts=1)
    failed = _failed_run(engine, job_id)
    operate(engine, retry=[failed], cancel=[], by="run-1")
    with pytest.raises(Exception, match="job_queue_operator_action_(valid|recorded)"):
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE job_queue SET {column} = {value} WHERE id = :id"), {"id": failed})
