import os
from datetime import timedelta

from dagster import ConfigurableResource


class SchedulingSettings(ConfigurableResource):
    """Live delivery of cron fire times. Fire times older than `catch_up_minutes` when
    the live sensor gets to them are not queued automatically: their hour's check fails
    and the hour is backfilled by selecting it. `lookahead_minutes` is how far ahead of
    its fire times an hour is queued: an hour, by default, so the next hour is queued as
    soon as its partition exists and never shows as missing. A queued run still waiting
    `max_wait_seconds` after it fell due fails the queue's health check."""

    catch_up_minutes: int = 15
    lookahead_minutes: int = 60
    max_wait_seconds: int = 300

    @property
    def catch_up(self) -> timedelta:
        return timedelta(minutes=self.catch_up_minutes)

    @property
    def lookahead(self) -> timedelta:
        return timedelta(minutes=self.lookahead_minutes)


def scheduling_settings_from_env() -> SchedulingSettings:
    return SchedulingSettings(
        catch_up_minutes=int(os.environ.get("ROTA_SCHEDULE_CATCHUP_MINUTES", "15")),
        lookahead_minutes=int(os.environ.get("ROTA_SCHEDULE_LOOKAHEAD_MINUTES", "60")),
        max_wait_seconds=int(os.environ.get("ROTA_QUEUE_MAX_WAIT_SECONDS", "300")),
    )
