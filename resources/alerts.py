import os
from typing import Optional

from dagster import ConfigurableResource, EnvVar


class AlertWebhookResource(ConfigurableResource):
    """Where failed runs are announced: an HTTP endpoint that takes a JSON POST (a Slack or
    Teams incoming webhook, or your own). Unset: no announcements."""

    url: Optional[str] = None
    timeout_seconds: float = 10.0


def alerts_from_env() -> AlertWebhookResource:
    return AlertWebhookResource(url=EnvVar("ROTA_ALERT_WEBHOOK_URL") if os.environ.get("ROTA_ALERT_WEBHOOK_URL")
                                else None)
