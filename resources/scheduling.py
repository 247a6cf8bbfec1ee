from dataclasses import dataclass, field
from datetime import timedelta

from dagster import ConfigurableResource
from pydantic import Field

from rota.resources.settings import read_environment


class SchedulingSettings(ConfigurableResource):
    """Live delivery of cron fire times. Fire times older than `catch_up_minutes` when
    the live sensor gets to them are not queued automatically: their hour's check fails
    and the hour is backfilled by selecting it. `lookahead_minutes` is how far ahead of
    its fire times an hour is queued: an hour, by default, so the next hour is queued as
    soon as its partition exists and never shows as missing. A queued run still waiting
    `max_wait_seconds` after it fell due fails the queue's health check."""

    catch_up_minutes: int = Field(default=15, description="a job's missed fire times still queued by the hour",
                                  json_schema_extra={"env": "ROTA_SCHEDULE_CATCHUP_MINUTES"})
    lookahead_minutes: int = Field(default=60, description="fire times queued ahead of time",
                                   json_schema_extra={"env": "ROTA_SCHEDULE_LOOKAHEAD_MINUTES"})
    max_wait_seconds: int = Field(default=300, description="a due run waiting longer fails the queue's check",
                                  json_schema_extra={"env": "ROTA_QUEUE_MAX_WAIT_SECONDS"})

    @property
    def catch_up(self) -> timedelta:
        return timedelta(minutes=self.catch_up_minutes)

    @property
    def lookahead(self) -> timedelta:
        return timedelta(minutes=self.lookahead_minutes)


def scheduling_settings_from_env() -> SchedulingSettings:
    return SchedulingSettings(**read_environment(SchedulingSettings))


# A dataclass, not a resource: a schedule's cron is part of its definition, fixed when the
# code location loads (pipelines/periods/partitions.py), not a setting of its runs.
@dataclass(frozen=True)
class DispatchSchedule:
    # Hourly: every zone's tasks appear within the hour after its local midnight.
    cron: str = field(default="0 * * * *", metadata={"env": "ROTA_DISPATCH_CRON",
                                                       "help": "the dispatch schedules' cron, in UTC"})


def dispatch_schedule_from_env() -> DispatchSchedule:
    return DispatchSchedule(**read_environment(DispatchSchedule))
