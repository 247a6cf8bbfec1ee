"""A backfill that did all it could is not shown failed.

Dagster closes an asset backfill as failed when a targeted partition got no
materialization from its runs (`_backfill_is_stalled` in Dagster 1.13), and has no
status for a partition a run rightly left alone: a period beyond what a scheduled run
creates yet. The task asset's backfill run says so on each such partition (an
observation carrying `not_dispatched`). This sensor closes such a backfill again as
completed when every partition Dagster counted failed carries that observation from one
of the backfill's own successful runs. Those partitions stay unmaterialized (grey, never
green) and leave the backfill's failed and in-progress counts; any other failure keeps
the backfill failed.

Dagster's daemon no longer writes a backfill once it is completed, so rewriting one then
races nothing. The backfill storage is Dagster's internal API; tests/dagster/test_backfills.py
holds it to the pinned version."""

import json
from datetime import timedelta

from dagster import DagsterEventType, DagsterRunStatus, DefaultSensorStatus, RunsFilter, SensorEvaluationContext, \
    SkipReason, sensor
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.definitions.events import AssetKeyPartitionKey
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._time import get_current_datetime

NOT_DISPATCHED = "not_dispatched"
# A backfill is judged once, when it closes; this bounds the look back after a pause.
LOOK_BACK = timedelta(days=7)


def left_alone_by_its_runs(instance, backfill_id: str) -> set[AssetKeyPartitionKey]:
    """The partitions a successful run of the backfill observed as not dispatched yet."""
    runs = instance.get_run_records(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id},
                                               statuses=[DagsterRunStatus.SUCCESS]))
    observed = set()
    for record in runs:
        for entry in instance.all_logs(record.dagster_run.run_id, of_type=DagsterEventType.ASSET_OBSERVATION):
            observation = entry.asset_observation
            if observation is not None and NOT_DISPATCHED in observation.metadata:
                observed.add(AssetKeyPartitionKey(observation.asset_key, observation.partition))
    return observed


def reclose(instance, backfill, asset_graph) -> list[AssetKeyPartitionKey] | None:
    """Close a failed backfill as completed if its only failures are partitions its runs
    rightly left alone; those partitions, or None when the backfill stays failed."""
    data = backfill.get_asset_backfill_data(asset_graph)
    failed = set(data.failed_and_downstream_subset.iterate_asset_partitions())
    if not failed or not failed <= left_alone_by_its_runs(instance, backfill.backfill_id):
        return None
    left_alone = AssetGraphSubset.from_asset_partition_set(failed, asset_graph)
    data = data._replace(failed_and_downstream_subset=data.failed_and_downstream_subset - left_alone,
                         requested_subset=data.requested_subset - left_alone)
    instance.update_backfill(backfill.with_asset_backfill_data(data, dynamic_partitions_store=instance,
                                                               asset_graph=asset_graph)
                             .with_status(BulkActionStatus.COMPLETED_SUCCESS))
    return sorted(failed, key=lambda k: (k.asset_key.to_user_string(), k.partition_key))


@sensor(name="backfill_outcome_sensor", minimum_interval_seconds=10, default_status=DefaultSensorStatus.RUNNING,
        description="Closes a backfill as completed when the only partitions Dagster counted failed are periods "
                    "its own runs observed as beyond what can be dispatched yet (see each partition's "
                    "not_dispatched observation).")
def backfill_outcome_sensor(context: SensorEvaluationContext) -> SkipReason:
    # The cursor holds the failed backfills already judged: each is judged once, when closed.
    judged = set(json.loads(context.cursor)) if context.cursor else set()
    closed = [b for b in context.instance.get_backfills(filters=BulkActionsFilter(
        statuses=[BulkActionStatus.COMPLETED_FAILED], created_after=get_current_datetime() - LOOK_BACK))
        if b.is_asset_backfill]
    asset_graph = context.repository_def.asset_graph
    said, stays_failed = [], []
    for backfill in closed:
        if backfill.backfill_id in judged:
            stays_failed.append(backfill.backfill_id)
            continue
        left_alone = reclose(context.instance, backfill, asset_graph)
        if left_alone is None:
            stays_failed.append(backfill.backfill_id)
            said.append(f"backfill {backfill.backfill_id} stays failed: a partition failed for another reason")
        else:
            listed = ", ".join(f"{k.asset_key.to_user_string()} {k.partition_key}" for k in left_alone)
            said.append(f"backfill {backfill.backfill_id} completed: nothing failed; left alone as not "
                        f"dispatchable yet: {listed}")
            context.log.info(said[-1])
    # Only ids still closed as failed and in the look back: the cursor does not grow.
    context.update_cursor(json.dumps(sorted(stays_failed)))
    return SkipReason("; ".join(said) or "no backfill closed as failed since the last evaluation")
