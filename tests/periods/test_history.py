"""Where rota's history starts: recorded by the first migration, read by every process
from the database (no setting), moved by `rota history-start`, and the first partition
of each asset is the first period a scheduled run after it ever reaches."""

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

from sqlalchemy import create_engine, text

from rota.pipelines.periods.partitions import first_task_partition
from rota.resources.database import migrate as migrations
from rota.resources.database.schema import FREQUENCIES
from rota.resources.database.server import driver_url

PRINT_STARTS = """
import json
from rota.pipelines.periods.partitions import HOURLY, NIGHTLY_PARTITIONS, TASK_PARTITIONS
def first(partitions):
    return partitions.start.strftime(partitions.fmt)
print(json.dumps({"hourly": first(HOURLY), "nightly": first(NIGHTLY_PARTITIONS),
                  **{f: first(p) for f, p in TASK_PARTITIONS.items()}}))
"""


def _starts_seen_by_a_process(database_url: str) -> dict:
    """What a code server or run worker builds: a fresh interpreter with only the URL."""
    env = {k: v for k, v in os.environ.items() if k != "ROTA_HISTORY_START"}
    done = subprocess.run([sys.executable, "-c", PRINT_STARTS], env={**env, "ROTA_DATABASE_URL": database_url},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _recorded(url: str, column: str = "started_at") -> datetime:
    engine = create_engine(driver_url(url))
    try:
        with engine.connect() as conn:
            return conn.execute(text(f"SELECT {column} FROM rota_history")).scalar_one().astimezone(timezone.utc)
    finally:
        engine.dispose()


def test_the_first_migration_records_the_start_and_every_process_reads_it(fresh_database):
    url = fresh_database()
    engine = create_engine(driver_url(url))
    with engine.begin() as conn:  # a database that never ran rota
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    before = datetime.now(timezone.utc)
    migrations.upgrade(url)
    started = _recorded(url)
    assert before - timedelta(seconds=5) <= started <= datetime.now(timezone.utc)
    assert _recorded(url, "installed_at") == started
    seen = _starts_seen_by_a_process(url)
    assert seen["hourly"] == started.strftime("%Y-%m-%d-%H:00")
    assert seen["nightly"] == started.date().isoformat()
    assert {f: seen[f] for f in FREQUENCIES} == {f: first_task_partition(f, started) for f in FREQUENCIES}
    migrations.upgrade(url)  # idempotent: a later migrate keeps the start
    assert _recorded(url) == started


def test_an_install_from_before_the_record_starts_at_its_oldest_duty_or_job(fresh_database):
    url = fresh_database()
    engine = create_engine(driver_url(url))
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    migrations.upgrade(url, "0014")
    engine = create_engine(driver_url(url))
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO duty (workspace_id, title, kind, frequency, timezone, created_at) "
            "VALUES (gen_random_uuid(), 'old', 'recurring', 'daily', 'UTC', '2025-03-07 05:30+00')"))
        conn.execute(text("INSERT INTO job (name, created_at) VALUES ('older', '2025-02-01 10:00+00')"))
    engine.dispose()
    migrations.upgrade(url)
    assert _recorded(url) == datetime(2025, 2, 1, 10, tzinfo=timezone.utc)


def test_rota_history_start_moves_it_and_a_new_process_backfills_from_there(database_url):
    env = {k: v for k, v in os.environ.items() if k != "ROTA_HISTORY_START"}
    moved = subprocess.run([sys.executable, "-m", "rota.pipelines.cli", "history-start", "2024-01-01"],
                           env={**env, "ROTA_DATABASE_URL": database_url}, capture_output=True, text=True, timeout=60)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert "2024-01-01T00:00+00:00" in moved.stdout and "reload the code location" in moved.stdout
    seen = _starts_seen_by_a_process(database_url)
    assert (seen["daily"], seen["monthly"], seen["yearly"]) == ("2023-12-31", "2023-12-01", "2023-01-01")
    # The queue's hours and the maintenance nights keep the install's start: no fire time
    # and no night from before rota existed looks owed.
    installed = _recorded(database_url, "installed_at")
    assert installed > datetime(2024, 1, 2, tzinfo=timezone.utc)
    assert (seen["hourly"], seen["nightly"]) == (installed.strftime("%Y-%m-%d-%H:00"), installed.date().isoformat())
    refused = subprocess.run([sys.executable, "-m", "rota.pipelines.cli", "history-start", "last tuesday"],
                             env={**env, "ROTA_DATABASE_URL": database_url}, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "must be a UTC date or instant" in refused.stdout, refused.stdout + refused.stderr
    future = subprocess.run([sys.executable, "-m", "rota.pipelines.cli", "history-start", "2999-01-01"],
                            env={**env, "ROTA_DATABASE_URL": database_url}, capture_output=True, text=True, timeout=60)
    assert future.returncode == 2 and "is in the future" in future.stdout, future.stdout + future.stderr
