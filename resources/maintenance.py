from dataclasses import dataclass, field

from rota.resources.settings import read_environment


# A plain dataclass, not a Dagster resource: only the nightly handler reads it, in
# `rota worker`, which runs no Dagster and should not pay for importing it.
@dataclass(frozen=True)
class MaintenanceSettings:
    """How long a finished run keeps its payload and error text.

    Past the retention the nightly maintenance compacts a finished run to its identity:
    the row stays, with its origin, state and times, so the fire time, event or source
    ref it was produced for is never produced again, however far back a backfill or a
    replayed cursor reaches."""

    retention_days: int = field(default=450, metadata={"env": "ROTA_RETENTION_DAYS",
                                                       "help": "days a finished queue run keeps its payload and error"})

    def __post_init__(self) -> None:
        if self.retention_days < 1:
            raise ValueError(f"retention_days must be at least 1, not {self.retention_days}")


def maintenance_settings_from_env() -> MaintenanceSettings:
    return MaintenanceSettings(**read_environment(MaintenanceSettings))
