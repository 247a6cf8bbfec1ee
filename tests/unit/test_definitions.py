"""The one Definitions, its settings and its partitions, loaded as a code server loads them."""

from datetime import datetime, timezone

import pytest

from rota.pipelines.definitions import defs
from rota.pipelines.periods.calendar import open_range
from rota.pipelines.periods.partitions import TASK_PARTITIONS
from rota.resources.database.schema import FREQUENCIES, MAX_LEAD_DAYS
from rota.resources.postgres import PostgresResource, postgres_from_env


def test_the_definitions_load_with_every_asset_schedule_and_sensor():
    repository = defs.get_repository_def()
    repository.load_all_definitions()  # what a code server does: names that clash fail here
    assert sorted(k.to_user_string() for k in repository.asset_graph.get_all_asset_keys()) == sorted(
        [f"{f}_tasks" for f in FREQUENCIES] + ["job_queue", "nightly_maintenance", "scheduled_runs"])
    assert sorted(s.name for s in repository.schedule_defs) == sorted(
        [f"{f}_tasks_schedule" for f in FREQUENCIES] + ["nightly_maintenance_schedule", "freshness_checks_schedule"])
    assert sorted(s.name for s in repository.sensor_defs) == [
        "backfill_outcome_sensor", "check_failure_alert_sensor", "event_dispatch_sensor", "github_issues_sensor", "job_queue_sensor",
        "run_failure_alert_sensor", "scheduled_runs_sensor"]
    # Every run names its job (the runs list's Target column).
    assert {s.name: s.job_name for s in repository.schedule_defs if s.name.endswith("_tasks_schedule")} == {
        f"{f}_tasks_schedule": f"dispatch_{f}_tasks" for f in FREQUENCIES}


@pytest.mark.parametrize("value", ["0", "8", "three", "-1", " 2", ""])
def test_a_dispatch_writer_count_out_of_range_is_refused_by_its_variable(monkeypatch, value):
    monkeypatch.setenv("ROTA_DISPATCH_WRITERS", value)
    with pytest.raises(ValueError, match=f"ROTA_DISPATCH_WRITERS must be a whole number from 1 to 7, not '{value}'"):
        postgres_from_env()


def test_the_dispatch_writer_count_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("ROTA_DISPATCH_WRITERS", raising=False)
    assert postgres_from_env().dispatch_writers == 3
    monkeypatch.setenv("ROTA_DISPATCH_WRITERS", "1")
    assert postgres_from_env().dispatch_writers == 1
    with pytest.raises(Exception, match="dispatch_writers"):
        PostgresResource(database_url="postgresql:///rota", dispatch_writers=0)


@pytest.mark.parametrize("frequency", FREQUENCIES)
def test_partitions_reach_the_longest_lead_in_the_easternmost_zone(frequency):
    now = datetime.now(timezone.utc)
    first, last = open_range(frequency, now, MAX_LEAD_DAYS)
    partitions = TASK_PARTITIONS[frequency]
    assert partitions.has_partition_key(first.partition_key)
    assert partitions.has_partition_key(last.partition_key), (last.partition_key, partitions.get_last_partition_key())
