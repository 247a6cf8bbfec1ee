"""A backfill closed failed only because its run rightly left future periods alone is closed
again as completed; any other failure keeps it failed. The backfill is recorded as
Dagster's daemon records it (tests/system/test_browser.py drives the daemon itself)."""

import time

from dagster import AssetKey, DagsterInstance, build_sensor_context, materialize
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.definitions.events import AssetKeyPartitionKey
from dagster._core.execution.asset_backfill import AssetBackfillData, AssetBackfillStatus
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    BACKFILL_ID_TAG,
)

from rota.pipelines.definitions import defs
from rota.schedules.backfills import backfill_outcome_sensor
from tests.helpers import add_duty

MONTHLY = AssetKey("monthly_tasks")
REPOSITORY = defs.get_repository_def()


def _subset(*partitions):
    return AssetGraphSubset.from_asset_partition_set({AssetKeyPartitionKey(MONTHLY, p) for p in partitions},
                                                     REPOSITORY.asset_graph)


def _backfill_run(instance, backfill_id, first, last):
    """The run a single-run backfill launches over first..last, as of 2026-12-25."""
    return materialize([defs.resolve_assets_def("monthly_tasks")], instance=instance,
                       tags={ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last,
                             BACKFILL_ID_TAG: backfill_id},
                       run_config={"ops": {"monthly_tasks": {"config": {"as_of": "2026-12-25T12:00:00Z"}}}})


def _closed_failed(instance, backfill_id, targeted, materialized, failed):
    """The backfill as Dagster's daemon closes it when targeted partitions got no materialization."""
    data = AssetBackfillData.empty(_subset(*targeted), time.time(), instance)._replace(
        requested_runs_for_target_roots=True, requested_subset=_subset(*targeted),
        materialized_subset=_subset(*materialized), failed_and_downstream_subset=_subset(*failed))
    instance.add_backfill(PartitionBackfill(
        backfill_id=backfill_id, status=BulkActionStatus.COMPLETED_FAILED, from_failure=False, tags={},
        backfill_timestamp=time.time(), asset_selection=[MONTHLY], asset_backfill_data=data,
        backfill_end_timestamp=time.time()))


def _evaluate(instance, cursor=None):
    context = build_sensor_context(instance=instance, repository_def=REPOSITORY, cursor=cursor)
    return backfill_outcome_sensor(context), context.cursor


def _counts(instance, backfill_id):
    data = instance.get_backfill(backfill_id).get_asset_backfill_data(REPOSITORY.asset_graph)
    [status] = data.get_backfill_status_per_asset_key(REPOSITORY.asset_graph)
    return status.num_targeted_partitions, {k: v for k, v in status.partitions_counts_by_status.items() if v}


def test_a_backfill_whose_only_failures_its_run_left_alone_as_future_is_completed(engine):
    add_duty(engine, timezone="UTC", lead_days=40)  # 2027-01 visible from 2026-12-22; 02 and 03 not yet
    instance = DagsterInstance.ephemeral()
    assert _backfill_run(instance, "future", "2027-01-01", "2027-03-01").success
    _closed_failed(instance, "future", ["2027-01-01", "2027-02-01", "2027-03-01"],
                   materialized=["2027-01-01"], failed=["2027-02-01", "2027-03-01"])

    said, cursor = _evaluate(instance)
    assert "backfill future completed" in said.skip_message and "monthly_tasks 2027-02-01" in said.skip_message
    assert instance.get_backfill("future").status is BulkActionStatus.COMPLETED_SUCCESS
    # Asked for three, one materialized, none failed, none in progress: the other two stay grey.
    assert _counts(instance, "future") == (3, {AssetBackfillStatus.MATERIALIZED: 1})
    assert instance.get_materialized_partitions(MONTHLY) == {"2027-01-01"}
    assert cursor == "[]"


def test_a_backfill_with_a_failure_no_run_observed_stays_failed_and_is_judged_once(engine):
    add_duty(engine, timezone="UTC", lead_days=40)
    instance = DagsterInstance.ephemeral()
    assert _backfill_run(instance, "gap", "2027-01-01", "2027-03-01").success
    # 2026-12 was targeted and never materialized, and no run said why: a real failure.
    _closed_failed(instance, "gap", ["2026-12-01", "2027-01-01", "2027-02-01", "2027-03-01"],
                   materialized=["2027-01-01"], failed=["2026-12-01", "2027-02-01", "2027-03-01"])

    said, cursor = _evaluate(instance)
    assert said.skip_message == "backfill gap stays failed: a partition failed for another reason"
    assert instance.get_backfill("gap").status is BulkActionStatus.COMPLETED_FAILED
    assert _counts(instance, "gap")[1][AssetBackfillStatus.FAILED] == 3
    assert cursor == '["gap"]'
    again, _ = _evaluate(instance, cursor)
    assert again.skip_message == "no backfill closed as failed since the last evaluation"


def test_an_observation_from_a_run_that_failed_does_not_excuse_a_partition(engine):
    add_duty(engine, timezone="UTC", lead_days=40)
    instance = DagsterInstance.ephemeral()
    result = _backfill_run(instance, "broken", "2027-01-01", "2027-03-01")
    instance.report_run_failed(result.dagster_run)  # as if a later step of the run had failed
    _closed_failed(instance, "broken", ["2027-01-01", "2027-02-01", "2027-03-01"],
                   materialized=["2027-01-01"], failed=["2027-02-01", "2027-03-01"])

    _evaluate(instance)
    assert instance.get_backfill("broken").status is BulkActionStatus.COMPLETED_FAILED
