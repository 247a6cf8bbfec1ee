import os

from dagster import ConfigurableResource
from pydantic import field_validator


class MaintenanceSettings(ConfigurableResource):
    """How long a finished run keeps its payload and error text.

    Past the retention the nightly maintenance compacts a finished run to its identity:
    the row stays, with its origin, state and times, so the fire time, event or source
    ref it was produced for is never produced again, however far back a backfill or a
    replayed cursor reaches."""

    retention_days: int = 450

    @field_validator("retention_days")
    @classmethod
    def at_least_a_day(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"retention_days must be at least 1, not {value}")
        return value


def maintenance_settings_from_env() -> MaintenanceSettings:
    return MaintenanceSettings(retention_days=int(os.environ.get("ROTA_RETENTION_DAYS", "450")))
