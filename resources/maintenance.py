import os
from datetime import datetime, timedelta

from dagster import ConfigurableResource
from pydantic import model_validator


class MaintenanceSettings(ConfigurableResource):
    """Retention of finished runs, and how far back a backfill of a queue producer may reach.

    The two are one decision: a run's row is its identity. Once the nightly maintenance
    prunes a finished run, nothing remembers that its fire time, event or ref was already
    produced, so a backfill reaching that far back would produce it again. Retention must
    therefore be longer than the backfill horizon, and backfills older than the horizon
    are refused."""

    retention_days: int = 450
    backfill_horizon_days: int = 400

    @model_validator(mode="after")
    def retention_outlives_the_backfill_horizon(self) -> "MaintenanceSettings":
        if self.backfill_horizon_days < 1:
            raise ValueError(f"backfill_horizon_days must be at least 1, not {self.backfill_horizon_days}")
        if self.retention_days <= self.backfill_horizon_days:
            raise ValueError(
                f"retention_days ({self.retention_days}) must be longer than backfill_horizon_days "
                f"({self.backfill_horizon_days}): pruning a finished run forgets its identity, and a "
                "backfill that reaches back past the retention would produce that run a second time"
            )
        return self

    @property
    def retention(self) -> timedelta:
        return timedelta(days=self.retention_days)

    def oldest_backfill(self, now: datetime) -> datetime:
        return now - timedelta(days=self.backfill_horizon_days)


def maintenance_settings_from_env() -> MaintenanceSettings:
    return MaintenanceSettings(
        retention_days=int(os.environ.get("ROTA_RETENTION_DAYS", "450")),
        backfill_horizon_days=int(os.environ.get("ROTA_BACKFILL_HORIZON_DAYS", "400")),
    )
