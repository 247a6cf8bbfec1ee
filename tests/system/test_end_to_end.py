"""rota as a user runs it: `rota dev` starts the real webserver, daemon and a worker; a
backfill is launched through the webserver's GraphQL API as the UI's dialog does; the
daemon ticks a dispatch schedule; the worker runs a queued run; SIGTERM stops everything."""

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest
import requests
from sqlalchemy import text

from rota.pipelines.periods.calendar import period_containing
from rota.pipelines.queue.enqueue import enqueue_scheduled
from rota.pipelines.queue.jobs import register_job
from rota.resources.database.server import dagster_database_url, database_name
from tests.helpers import add_duty, keys_by_duty

pytestmark = pytest.mark.e2e

LAUNCH_BACKFILL = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on InvalidStepError { invalidStepKey }
    ... on InvalidOutputError { stepKey invalidOutputName }
    ... on UnauthorizedError { message }
  }
}
"""

BACKFILL_STATUS = """
query Status($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { status }
    ... on PythonError { message }
  }
}
"""


def run_state(engine, run_id: int) -> str:
    with engine.connect() as conn:
        return conn.execute(text("SELECT state FROM job_queue WHERE id = :id"), {"id": run_id}).scalar_one()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def graphql(port: int, query: str, variables: dict) -> dict:
    response = requests.post(f"http://127.0.0.1:{port}/graphql",
                             json={"query": query, "variables": variables}, timeout=30)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


def answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/server_info", timeout=2).ok
    except requests.RequestException:
        return False


@pytest.fixture
def rota_dev(database_url, test_server, tmp_path):
    """`rota dev` on a fresh database, its dispatch schedules ticking every minute."""
    yield from start_rota_dev(database_url, test_server, tmp_path, {"ROTA_DISPATCH_CRON": "* * * * *"})


def start_rota_dev(database_url, test_server, tmp_path, settings, history_start=None):
    """`rota dev` as rota's role on databases that exist, the way a DBA hands them over:
    it must need no CREATEDB. With `history_start`, the history starts there, moved the
    way an operator moves it (`rota history-start`), and every process reads it from the
    database as deployed rota does."""
    port = free_port()
    storage = database_name(dagster_database_url(database_url))
    test_server.create(storage)
    env = {**os.environ, "ROTA_DATABASE_URL": database_url, "ROTA_HOME": str(tmp_path / "home"), **settings}
    if history_start:
        env.pop("ROTA_HISTORY_START")
        subprocess.run([str(Path(sys.executable).parent / "rota"), "history-start", history_start], env=env,
                       check=True, capture_output=True, timeout=60)
    log = open(tmp_path / "rota-dev.log", "w")
    process = subprocess.Popen([str(Path(sys.executable).parent / "rota"), "dev", "--port", str(port)],
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process, port, tmp_path / "rota-dev.log"
    finally:
        stop_tree(process)
        log.close()
        test_server.drop(storage)


def stop_tree(process: subprocess.Popen) -> None:
    """Stop `rota dev` as Ctrl-C does (it stops the children it started in sessions of their
    own), and kill whatever is left of its tree after a while."""
    if process.poll() is not None:
        return
    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    process.send_signal(signal.SIGINT)
    _, alive = psutil.wait_procs(tree, timeout=60)
    for member in alive:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass


def test_rota_dev_backfills_through_graphql_and_the_daemon_ticks_a_schedule(engine, rota_dev):
    process, port, log_path = rota_dev
    this_month = period_containing("monthly", datetime.now(timezone.utc).date())
    months = [period_containing("monthly", this_month.start - timedelta(days=1))]
    while len(months) < 13:  # thirteen whole months, all in the past in every zone
        months.insert(0, period_containing("monthly", months[0].start - timedelta(days=1)))
    monthly = [add_duty(engine, timezone=zone) for zone in ("UTC", "Asia/Tokyo", "America/Denver")]
    standing = add_duty(engine, kind="standing")
    daily = add_duty(engine, frequency="daily", timezone="UTC")

    try:
        wait_for(lambda: answers(port) or process.poll() is not None, 120, "the Dagster webserver")
        assert process.poll() is None, log_path.read_text()[-4000:]
        launched = graphql(port, LAUNCH_BACKFILL, {"params": {
            "assetSelection": [{"path": ["monthly_tasks"]}],
            "partitionNames": [p.partition_key for p in months],
            "fromFailure": False,
        }})["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched

        def backfill_done():
            status = graphql(port, BACKFILL_STATUS, {"id": launched["backfillId"]})["partitionBackfillOrError"]
            assert status.get("status") not in ("FAILED", "CANCELED", "COMPLETED_FAILED"), status
            return status.get("status") in ("COMPLETED", "COMPLETED_SUCCESS")

        wait_for(backfill_done, 240, "the backfill to complete", interval=2)
        keys = keys_by_duty(engine)
        for duty_id in monthly:
            assert [p.key for p in months] == [k for k in keys[duty_id] if k < this_month.key]
            assert set(keys[duty_id]) - {p.key for p in months} <= {this_month.key}
        assert standing not in keys

        noop = register_job(engine, "noop", schedule="*/5 * * * *", timezone="Europe/London")
        run_id = enqueue_scheduled(engine, noop, datetime(2026, 1, 1, tzinfo=timezone.utc)).run_id
        wait_for(lambda: run_state(engine, run_id) == "succeeded", 120, "rota dev's worker to run a queued run")

        today = datetime.now(timezone.utc).date().isoformat()
        wait_for(lambda: keys_by_duty(engine).get(daily), 240, "the daemon's daily dispatch tick", interval=2)
        assert all(key >= today for key in keys_by_duty(engine)[daily])
    finally:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)] \
            if process.poll() is None else []
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 0, log_path.read_text()[-4000:]
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert alive == [], [p.cmdline() for p in alive]
