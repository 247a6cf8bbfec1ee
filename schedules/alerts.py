"""Telling an operator that a run failed: a webhook, set by configuration.

`run_failure_alert_sensor` posts one JSON message per failed run of this code location to
ROTA_ALERT_WEBHOOK_URL (read through an EnvVar: Dagster shows its name, never its value,
so a URL that carries a token stays secret). Without it set, failures are only in Dagster."""

import logging

import requests
from dagster import DefaultSensorStatus, RunFailureSensorContext, run_failure_sensor

from resources.alerts import AlertWebhookResource

log = logging.getLogger(__name__)


def failure_message(context: RunFailureSensorContext) -> dict:
    run = context.dagster_run
    return {
        "text": f"rota: run {run.run_id} of {run.job_name} failed: {context.failure_event.message}",
        "run_id": run.run_id,
        "job": run.job_name,
        "partition_range": [run.tags.get("dagster/asset_partition_range_start"),
                            run.tags.get("dagster/asset_partition_range_end")],
        "error": context.failure_event.message,
    }


@run_failure_sensor(name="run_failure_alert_sensor", default_status=DefaultSensorStatus.RUNNING,
                    description="Posts each failed run to ROTA_ALERT_WEBHOOK_URL.")
def run_failure_alert_sensor(context: RunFailureSensorContext, alerts: AlertWebhookResource) -> None:
    if not alerts.url:
        return
    response = requests.post(alerts.url, json=failure_message(context), timeout=alerts.timeout_seconds)
    response.raise_for_status()


ALERT_SENSORS = [run_failure_alert_sensor]
