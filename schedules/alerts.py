"""Telling an operator that something failed: a webhook, set by configuration.

`run_failure_alert_sensor` posts one JSON message per failed run of this code location to
ROTA_ALERT_WEBHOOK_URL (read through an EnvVar: Dagster shows its name, never its value,
so a URL that carries a token stays secret). `check_failure_alert_sensor` posts each
asset check of this code location that turns failed at ERROR (the freshness checks, the
queue's health): once when it turns, not at every failing evaluation after. Without the
URL set, failures are only in Dagster."""

import json
import logging

import requests
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    DefaultSensorStatus,
    RunFailureSensorContext,
    SensorEvaluationContext,
    SkipReason,
    run_failure_sensor,
    sensor,
)

from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG
from rota.resources.alerts import AlertWebhookResource

log = logging.getLogger(__name__)


def failure_message(context: RunFailureSensorContext) -> dict:
    run = context.dagster_run
    return {
        "text": f"rota: run {run.run_id} of {run.job_name} failed: {context.failure_event.message}",
        "run_id": run.run_id,
        "job": run.job_name,
        "partition_range": [run.tags.get(PARTITION_RANGE_START_TAG), run.tags.get(PARTITION_RANGE_END_TAG)],
        "error": context.failure_event.message,
    }


@run_failure_sensor(name="run_failure_alert_sensor", default_status=DefaultSensorStatus.RUNNING,
                    description="Posts each failed run to ROTA_ALERT_WEBHOOK_URL.")
def run_failure_alert_sensor(context: RunFailureSensorContext, alerts: AlertWebhookResource) -> None:
    if not alerts.url:
        return
    response = requests.post(alerts.url, json=failure_message(context), timeout=alerts.timeout_seconds)
    response.raise_for_status()


def check_failure_message(key, evaluation) -> dict:
    return {
        "text": f"rota: check {key.name} on {key.asset_key.to_user_string()} failed: {evaluation.description}",
        "asset": key.asset_key.to_user_string(),
        "check": key.name,
        "description": evaluation.description,
    }


@sensor(name="check_failure_alert_sensor", minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Posts each asset check that turns failed at ERROR to ROTA_ALERT_WEBHOOK_URL, once per turn.")
def check_failure_alert_sensor(context: SensorEvaluationContext, alerts: AlertWebhookResource) -> SkipReason:
    # The cursor holds each check's last finished verdict: "failed" or "passed".
    verdicts = json.loads(context.cursor) if context.cursor else {}
    keys = sorted(context.repository_def.asset_graph.asset_check_keys, key=lambda k: k.to_user_string())
    latest = context.instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    posted = []
    for key in keys:
        record = latest.get(key)
        # Dagster exports no public name for an execution's status; the evaluation it stores
        # once the check has answered is public, and says whether it passed.
        evaluation = record.event.dagster_event.event_specific_data if record and record.event else None
        if not isinstance(evaluation, AssetCheckEvaluation):
            continue  # planned, running or skipped: no verdict
        failed = not evaluation.passed and evaluation.severity is AssetCheckSeverity.ERROR
        name = key.to_user_string()
        if failed and verdicts.get(name) != "failed" and alerts.url:
            response = requests.post(alerts.url, json=check_failure_message(key, evaluation),
                                     timeout=alerts.timeout_seconds)
            response.raise_for_status()
            posted.append(name)
        verdicts[name] = "failed" if failed else "passed"
    context.update_cursor(json.dumps(verdicts, sort_keys=True))
    return SkipReason(f"posted {', '.join(posted)}" if posted else "no check turned failed")


ALERT_SENSORS = [run_failure_alert_sensor, check_failure_alert_sensor]
