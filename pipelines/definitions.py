"""The code location: one explicit Definitions, built from module lists."""

from dagster import Definitions, EnvVar

from pipelines.assets import TASK_ASSETS
from pipelines.queue_assets import QUEUE_ASSETS
from resources.postgres import PostgresResource
from resources.scheduling import scheduling_settings_from_env
from schedules.dispatch import DISPATCH_SCHEDULES
from schedules.queue import QUEUE_SENSORS

defs = Definitions(
    assets=[*TASK_ASSETS, *QUEUE_ASSETS],
    schedules=[*DISPATCH_SCHEDULES],
    sensors=[*QUEUE_SENSORS],
    resources={
        "database": PostgresResource(database_url=EnvVar("ROTA_DATABASE_URL")),
        "scheduling": scheduling_settings_from_env(),
    },
)
