"""The Sources' assets: the nightly maintenance Source's runs, one daily partition per
night. The Source's handler stays in pipelines.sources.nightly, free of Dagster: `rota
worker` imports that, never this module, and starts without loading Dagster."""

from datetime import date

from dagster import AssetExecutionContext, MaterializeResult, asset

from rota.pipelines.periods.partitions import NIGHTLY_PARTITIONS, SINGLE_RUN
from rota.pipelines.queue.jobs import register_job
from rota.pipelines.queue.producing import produce_many
from rota.pipelines.sources.nightly import NIGHTLY
from rota.resources.postgres import PostgresResource


@asset(
    name="nightly_maintenance",
    partitions_def=NIGHTLY_PARTITIONS,
    backfill_policy=SINGLE_RUN,
    group_name="queue",
    kinds={"postgres"},
    description="One nightly-maintenance run per day (ref nightly/YYYY-MM-DD). Backfill by "
                "selecting days; a day already produced is left alone, however long ago it ran.",
)
def nightly_maintenance(context: AssetExecutionContext, database: PostgresResource) -> MaterializeResult:
    days = [date.fromisoformat(key) for key in context.partition_keys]
    engine = database.engine()
    register_job(engine, NIGHTLY.job_name)
    produced = produce_many(engine, NIGHTLY.name,
                            [(NIGHTLY.ref(d), NIGHTLY.job_name, {"date": d.isoformat()}) for d in days])
    return MaterializeResult(metadata={
        "days": len(days),
        "created": produced.count("created"),
        "refreshed": produced.count("refreshed"),
        "unchanged": produced.count("unchanged"),
    })


SOURCE_ASSETS = [nightly_maintenance]
