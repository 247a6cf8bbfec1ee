"""The one Definitions, its settings and its partitions, loaded as a code server loads them."""

from datetime import datetime, timezone

import pytest

from rota.pipelines.definitions import defs
from rota.pipelines.periods.calendar import following, open_range, period_from_partition_key
from rota.pipelines.periods.partitions import TASK_PARTITIONS
from rota.resources.database.schema import FREQUENCIES
from rota.resources.postgres import PostgresResource, postgres_from_env


def test_the_definitions_load_with_every_asset_schedule_and_sensor():
    repository = defs.get_repository_def()
    repository.load_all_definitions()  # what a code server does: names that clash fail here
    assert sorted(k.to_user_string() for k in repository.asset_graph.get_all_asset_keys()) == sorted(
        [f"{f}_tasks" for f in FREQUENCIES] + ["job_queue", "nightly_maintenance", "scheduled_runs"])
    assert sorted(s.name for s in repository.schedule_defs) == sorted(
        [f"{f}_tasks_schedule" for f in FREQUENCIES] + ["nightly_maintenance_schedule", "freshness_checks_schedule"])
    assert sorted(s.name for s in repository.sensor_defs) == [
        "check_failure_alert_sensor", "event_dispatch_sensor", "github_issues_sensor", "job_queue_sensor",
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
def test_task_partitions_end_at_the_period_begun_in_the_easternmost_zone(frequency):
    """Every period current somewhere on Earth is a partition, and none that has begun nowhere."""
    before = datetime.now(timezone.utc)
    partitions = TASK_PARTITIONS[frequency]
    last = partitions.get_last_partition_key()
    after = datetime.now(timezone.utc)
    first, current = open_range(frequency, before, 0)
    assert partitions.has_partition_key(first.partition_key)
    assert last in {current.partition_key, open_range(frequency, after, 0)[1].partition_key}
    assert not partitions.has_partition_key(following(period_from_partition_key(frequency, last)).partition_key)
