from typing import Optional

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from rota.resources.settings import read_environment


class AlertWebhookResource(ConfigurableResource):
    """Where failed runs are announced: an HTTP endpoint that takes a JSON POST (a Slack or
    Teams incoming webhook, or your own). Unset: no announcements."""

    url: Optional[str] = Field(default=None, description="where failed runs and checks are posted as JSON "
                                                         "(unset: nowhere)",
                               json_schema_extra={"env": "ROTA_ALERT_WEBHOOK_URL", "secret": True})
    timeout_seconds: float = 10.0


def alerts_from_env() -> AlertWebhookResource:
    return AlertWebhookResource(**read_environment(AlertWebhookResource, secret=EnvVar))
