import os
from dataclasses import dataclass


# A plain dataclass, not a Dagster resource: only the nightly handler reads it, in
# `rota worker`, which runs no Dagster and should not pay for importing it.
@dataclass(frozen=True)
class MaintenanceSettings:
    """How long a finished run keeps its payload and error text.

    Past the retention the nightly maintenance compacts a finished run to its identity:
    the row stays, with its origin, state and times, so the fire time, event or source
    ref it was produced for is never produced again, however far back a backfill or a
    replayed cursor reaches."""

    retention_days: int = 450

    def __post_init__(self) -> None:
        if self.retention_days < 1:
            raise ValueError(f"retention_days must be at least 1, not {self.retention_days}")


def maintenance_settings_from_env() -> MaintenanceSettings:
    raw = os.environ.get("ROTA_RETENTION_DAYS", "450")
    try:
        days = int(raw)
    except ValueError:
        raise ValueError(f"ROTA_RETENTION_DAYS must be a whole number of days, not {raw!r}") from None
    return MaintenanceSettings(retention_days=days)
