"""The code location: one explicit Definitions, built from module lists."""

from dagster import Definitions

from rota.pipelines.dispatch.assets import TASK_ASSETS
from rota.pipelines.queue.assets import QUEUE_ASSETS
from rota.pipelines.queue.view import job_queue_asset, queue_health_check
from rota.pipelines.sources.assets import SOURCE_ASSETS
from rota.resources.alerts import alerts_from_env
from rota.resources.github import github_from_env
from rota.resources.postgres import postgres_from_env
from rota.resources.scheduling import scheduling_settings_from_env
from rota.schedules.alerts import ALERT_SENSORS
from rota.schedules.dispatch import DISPATCH_JOBS, DISPATCH_SCHEDULES
from rota.schedules.freshness import freshness_checks_job, freshness_checks_schedule
from rota.schedules.github import GITHUB_SENSORS
from rota.schedules.maintenance import MAINTENANCE_JOBS, MAINTENANCE_SCHEDULES
from rota.schedules.queue import QUEUE_JOBS, QUEUE_SENSORS

defs = Definitions(
    assets=[*TASK_ASSETS, *QUEUE_ASSETS, *SOURCE_ASSETS, job_queue_asset],
    asset_checks=[queue_health_check],
    jobs=[*DISPATCH_JOBS.values(), *MAINTENANCE_JOBS, *QUEUE_JOBS, freshness_checks_job],
    schedules=[*DISPATCH_SCHEDULES, *MAINTENANCE_SCHEDULES, freshness_checks_schedule],
    sensors=[*QUEUE_SENSORS, *GITHUB_SENSORS, *ALERT_SENSORS],
    resources={
        "database": postgres_from_env(),
        "scheduling": scheduling_settings_from_env(),
        "github": github_from_env(),
        "alerts": alerts_from_env(),
    },
)
