"""The code location: one explicit Definitions, built from module lists."""

from dagster import Definitions, EnvVar

from pipelines.assets import TASK_ASSETS
from resources.postgres import PostgresResource
from schedules.dispatch import DISPATCH_SCHEDULES

defs = Definitions(
    assets=[*TASK_ASSETS],
    schedules=[*DISPATCH_SCHEDULES],
    resources={"database": PostgresResource(database_url=EnvVar("ROTA_DATABASE_URL"))},
)
