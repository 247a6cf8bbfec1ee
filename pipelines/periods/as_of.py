"""The instant a run works as of: its `as_of` run config, or now."""

from datetime import datetime, timezone
from typing import Optional

from dagster import Config, Failure

from rota.pipelines.periods.calendar import parse_instant


class AsOfConfig(Config):
    as_of: Optional[str] = None
    """ISO 8601 instant with a UTC offset. Default: the schedule's tick, or now."""


def run_instant(config: AsOfConfig) -> datetime:
    """In UTC, whatever offset the config was written with: a run's log and metadata print
    it, and every instant rota prints is UTC."""
    if config.as_of is None:
        return datetime.now(timezone.utc)
    try:
        return parse_instant(config.as_of).astimezone(timezone.utc)
    except ValueError as error:
        raise Failure(description=f"run config rejected: {error}") from None
