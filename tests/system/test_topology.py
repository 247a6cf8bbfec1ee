"""Dagster's production topology, without containers: from the installed package, a code
server of its own (`dagster code-server start`), the webserver and the daemon pointed at it
over gRPC, all on deploy/dagster.yaml with only the run launcher swapped for the default
one. A 13-month backfill is launched through GraphQL, its run worker is SIGKILLed mid-run,
and the instance's failure detection and run retries finish the work exactly."""

import os
import signal
import subprocess
from datetime import date, timedelta
from pathlib import Path

import psutil
import pytest
import requests
import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from sqlalchemy import make_url, text

from benchmarks.data import load_duties
from rota.pipelines.cli.dev import DAEMON
from rota.pipelines.periods.calendar import period_containing
from rota.resources.database.server import dagster_database_url, database_name
from tests.system.test_end_to_end import BACKFILL_STATUS, LAUNCH_BACKFILL, answers, free_port, graphql, wait_for
from tests.system.test_package import installed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DUTIES = 60_000


def _instance_env(database_url: str) -> dict[str, str]:
    """deploy/dagster.yaml's variables for a storage database beside rota's. A server
    reached by its socket directory gets an empty host, and libpq finds it by PGHOST."""
    url = make_url(dagster_database_url(database_url))
    socket_dir = url.query.get("host")
    return {"DAGSTER_PG_USERNAME": url.username, "DAGSTER_PG_PASSWORD": url.password or "",
            "DAGSTER_PG_HOST": "" if socket_dir else url.host, "DAGSTER_PG_PORT": str(url.port or 5432),
            "DAGSTER_PG_DB": url.database, **({"PGHOST": socket_dir} if socket_dir else {})}


def _tasks(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM task")).scalar_one()


def _run_worker(code_server: subprocess.Popen) -> psutil.Process | None:
    """The code server's gRPC server runs each run it is asked to launch in a process it
    spawns with multiprocessing (DefaultRunLauncher's run worker)."""
    for child in psutil.Process(code_server.pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        try:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for member in tree:
            member.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=20)
        for member in alive:
            member.kill()


def test_a_killed_run_worker_is_detected_and_retried_to_exactly_the_tasks(
        installed, database_url, engine, test_server, tmp_path, monkeypatch):  # noqa: F811
    _, python, _ = installed
    storage = database_name(dagster_database_url(database_url))
    test_server.create(storage)
    load_duties(engine, DUTIES, frequencies=[("monthly", 1)])
    months = [period_containing("monthly", date.today())]
    while len(months) < 14:
        months.insert(0, period_containing("monthly", months[0].start - timedelta(days=1)))
    months = months[:13]  # thirteen whole months before this one, in the past in every zone

    home = tmp_path / "dagster_home"
    home.mkdir()
    instance_config = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text())
    del instance_config["run_launcher"]  # containers cannot run here: the default launcher
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config))
    grpc_port, web_port = free_port(), free_port()
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": {
        "host": "127.0.0.1", "port": grpc_port, "location_name": "rota"}}]}))
    empty = tmp_path / "cwd"
    empty.mkdir()
    # One writer: the run's three pages then commit one after another, a page's write apart,
    # so the kill lands between them. With three writers they committed together, and the
    # run could finish before the first of them was seen.
    # No PGTZ in a Dagster process (docs/deploy.md; test_standby.py says what it breaks).
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ROTA_", "DAGSTER_")) and k != "PGTZ"},
           "ROTA_DATABASE_URL": database_url, "DAGSTER_HOME": str(home), "ROTA_HOME": str(tmp_path / "rota"),
           "ROTA_DISPATCH_WRITERS": "1",
           **_instance_env(database_url)}
    for key, value in env.items():
        if key.startswith("DAGSTER_PG_") or key in ("PGHOST", "DAGSTER_HOME"):
            monkeypatch.setenv(key, value)
    # The operator moves rota's history back to the first month it backfills, as documented.
    moved = subprocess.run([str(python), "-m", "rota.pipelines.cli", "history-start", months[0].start.isoformat()],
                           cwd=empty, env=env, capture_output=True, text=True, timeout=120)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("code-server", "webserver", "daemon")}
    commands = {
        "code-server": [str(python), "-m", "dagster", "code-server", "start", "-h", "127.0.0.1", "-p", str(grpc_port),
                        "-m", "rota.pipelines.definitions", "--location-name", "rota"],
        "webserver": [str(python), "-m", "dagster_webserver", "-h", "127.0.0.1", "-p", str(web_port),
                      "-w", str(workspace)],
        "daemon": [str(python), "-c", DAEMON, "run", "-w", str(workspace)],
    }
    processes = {}

    def start(name):
        processes[name] = subprocess.Popen(commands[name], cwd=empty, env=env, stdout=logs[name],
                                           stderr=subprocess.STDOUT)

    def said(name):
        return (tmp_path / f"{name}.log").read_text()[-3000:]

    def serving():
        assert processes["code-server"].poll() is None, said("code-server")
        return subprocess.run([str(python), "-m", "dagster", "api", "grpc-health-check", "-p", str(grpc_port)],
                              cwd=empty, env=env, capture_output=True).returncode == 0

    try:
        start("code-server")  # first, as the Helm chart's probes order it
        wait_for(serving, 120, "the code server's gRPC health check")
        start("webserver")
        start("daemon")
        wait_for(lambda: answers(web_port) or any(p.poll() is not None for p in processes.values()), 180,
                 "the webserver")
        assert all(p.poll() is None for p in processes.values()), {n: said(n) for n in processes}
        launched = wait_for(lambda: _launch(web_port, months), 120, "the code location to load", interval=2)
        worker = wait_for(lambda: (_tasks(engine) > 0 and _run_worker(processes["code-server"])), 180,
                          "the run worker to write its first tasks", interval=0.1)
        worker.kill()
        killed_at = _tasks(engine)
        expected = DUTIES * 13
        assert 0 < killed_at < expected, "the run finished before it could be killed: give it more duties"

        instance = DagsterInstance.from_config(str(home))
        try:
            def retried():
                runs = instance.get_runs(RunsFilter(tags={"dagster/backfill": launched}))
                return len(runs) >= 2 and any(r.status == DagsterRunStatus.SUCCESS for r in runs) and runs

            runs = wait_for(retried, 300, "a retry of the killed run to succeed", interval=2)
            assert _tasks(engine) == expected
            failed = [r for r in runs if r.status == DagsterRunStatus.FAILURE]
            succeeded = [r for r in runs if r.status == DagsterRunStatus.SUCCESS]
            assert len(failed) == 1 and len(succeeded) == 1, [(r.run_id, r.status) for r in runs]
            assert succeeded[0].tags.get("dagster/parent_run_id") == failed[0].run_id
            assert succeeded[0].tags.get("dagster/retry_number") == "1"
            crash = [e.message for e in instance.all_logs(failed[0].run_id) if e.message]
            assert any("unexpectedly" in m or "SIGKILL" in m or "exit code -9" in m for m in crash), crash[-5:]
        finally:
            instance.dispose()
        with engine.connect() as conn:
            per_duty = conn.execute(text("SELECT count(DISTINCT duty_id), min(n), max(n) FROM (SELECT duty_id, "
                                         "count(*) AS n FROM task GROUP BY duty_id) d")).one()
            keys = conn.execute(text("SELECT array_agg(DISTINCT period_key ORDER BY period_key) FROM task")).scalar()
        assert tuple(per_duty) == (DUTIES, 13, 13)
        assert keys == [m.key for m in months]
        status = graphql(web_port, BACKFILL_STATUS, {"id": launched})["partitionBackfillOrError"]
        assert status["__typename"] == "PartitionBackfill", status
    finally:
        _stop(list(processes.values()))
        for log in logs.values():
            log.close()
        test_server.drop(storage)


def _launch(port: int, months) -> str | None:
    try:
        launched = graphql(port, LAUNCH_BACKFILL, {"params": {
            "assetSelection": [{"path": ["monthly_tasks"]}],
            "partitionNames": [m.partition_key for m in months],
            "fromFailure": False,
        }})["launchPartitionBackfill"]
    except (AssertionError, requests.HTTPError):
        return None  # the webserver has not loaded the code location yet
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]
