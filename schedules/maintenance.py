"""The nightly maintenance Source runs nightly: at 02:00 UTC it materialises the day
that just ended."""

from dagster import DefaultScheduleStatus, build_schedule_from_partitioned_job, define_asset_job

from rota.pipelines.sources.assets import nightly_maintenance

nightly_maintenance_job = define_asset_job("nightly_maintenance_job", selection=[nightly_maintenance])
nightly_maintenance_schedule = build_schedule_from_partitioned_job(
    nightly_maintenance_job, name="nightly_maintenance_schedule", hour_of_day=2,
    default_status=DefaultScheduleStatus.RUNNING,
)

MAINTENANCE_JOBS = [nightly_maintenance_job]
MAINTENANCE_SCHEDULES = [nightly_maintenance_schedule]
