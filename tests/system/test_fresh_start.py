"""The front door, from nothing: the README's first command, exactly as written, in a fresh
copy of the tree on which rota never ran (no `.rota/`, no server, no database), and an
installed rota started from an empty directory. Each reaches the UI with the demo data,
shows no partition from before rota existed, and leaves no process behind on Ctrl-C."""

import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil
import psycopg
import pytest

from rota.resources.database.schema import FREQUENCIES
from tests.system.test_end_to_end import answers, free_port, graphql, wait_for
from tests.system.test_package import installed
from tests.system.test_project import ROOT, readme_commands

pytestmark = pytest.mark.e2e

PARTITIONS = """{ assetNodes { assetKey { path } partitionKeysByDimension { partitionKeys }
                                 partitionStats { numMaterialized numPartitions numFailed } } }"""
STARTUP_RUNS = """{ runsOrError(filter: {tags: [{key: "rota/started_by", value: "rota dev"}]}) {
                    ... on Runs { results { tags { key value } } } } }"""
# What the harness sets for itself; a newcomer's shell has none of it.
HARNESS_ONLY = ("ROTA_DATABASE_URL", "ROTA_ADMIN_URL", "ROTA_HOME", "ROTA_HISTORY_START", "DAGSTER_HOME",
                "ROTA_DAGSTER_STORAGE_URL", "VIRTUAL_ENV", "PYTHONPATH")


def _newcomer_env(**extra) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in HARNESS_ONLY}, **extra}


def _copy_tree(destination: Path) -> Path:
    shutil.copytree(ROOT, destination, ignore=shutil.ignore_patterns(
        ".venv", ".rota", ".git", "*.egg-info", "build", "dist", "__pycache__", ".pytest_cache"))
    return destination


def _processes_of(path: Path) -> list[str]:
    """Every process whose command line or executable lies under `path`."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "exe"]):
        words = [*(process.info["cmdline"] or []), process.info["exe"] or ""]
        if any(str(path) in word for word in words):
            found.append(f"{process.info['pid']}: {' '.join(process.info['cmdline'] or [])}")
    return found


def _database_url(log: Path) -> str:
    said = re.search(r"rota: database (\S+) ", log.read_text())
    assert said, log.read_text()[-3000:]
    return said.group(1)


def _run_until_serving(command: list[str], cwd: Path, env: dict, log: Path, port: int, timeout: float):
    """Start `command` in a session of its own (a terminal's foreground job) and wait for
    the UI; a start that fails says why from its log."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)

    def serving():
        if process.poll() is not None:
            raise AssertionError(f"exited {process.returncode} before serving:\n{log.read_text()[-4000:]}")
        return answers(port)

    try:
        wait_for(serving, timeout, f"the Dagster UI on port {port}", interval=2)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return process


LOCATIONS = "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }"
# What a newcomer's terminal must not fill with: code servers that lost their parent, the
# daemon's line per sensor evaluation, every event of every run.
NOISE = ("No heartbeat received", "Checking for new runs for sensor", "- DEBUG -")


def _check_demo_and_partitions(port: int, url: str, log: Path) -> None:
    with psycopg.connect(url) as conn:
        duties = conn.execute("SELECT count(*) FROM duty").fetchone()[0]
        started = conn.execute("SELECT started_at FROM rota_history").fetchone()[0]
        # rota dev works as rota's owner, as on a server of your own, not as the superuser.
        assert conn.execute("SELECT current_user, pg_get_userbyid(datdba) FROM pg_database "
                            "WHERE datname = current_database()").fetchone() == ("rota_owner", "rota_owner")
        # Dispatched once at start: the tasks are there before the next top of the hour.
        tasks = conn.execute("SELECT count(DISTINCT duty_id) FROM task").fetchone()[0]
    assert duties == 3000 and tasks > 0
    locations = graphql(port, LOCATIONS, {})["workspaceOrError"]["locationEntries"]
    assert [entry["name"] for entry in locations] == ["rota"]
    nodes = wait_for(lambda: [n for n in graphql(port, PARTITIONS, {})["assetNodes"]
                              if n["assetKey"]["path"] == ["daily_tasks"]], 120, "the code location to load")
    [daily] = nodes
    first = daily["partitionKeysByDimension"][0]["partitionKeys"][0]
    # The first partition is the period the first dispatch after the start reaches, in the
    # zone furthest behind UTC: nothing from before rota existed asks to be filled.
    assert first in {(started.date() - timedelta(days=d)).isoformat() for d in (0, 1)}, \
        (first, started)

    def every_hour_delivered():
        [queue] = [n for n in graphql(port, PARTITIONS, {})["assetNodes"] if n["assetKey"]["path"] == ["scheduled_runs"]]
        stats = queue["partitionStats"]
        assert stats["numFailed"] == 0, stats
        return 0 < stats["numMaterialized"] == stats["numPartitions"] <= 4

    # Every task partition a person can see is done: the start-up dispatch made what is
    # owed so far, and no partition lies where nothing is owed yet.
    for frequency in FREQUENCIES:
        [node] = [n for n in graphql(port, PARTITIONS, {})["assetNodes"]
                  if n["assetKey"]["path"] == [f"{frequency}_tasks"]]
        stats = node["partitionStats"]
        assert stats["numFailed"] == 0 and 0 < stats["numMaterialized"] == stats["numPartitions"], (frequency, stats)
    # Its runs say who started them, and none claims a schedule's tick it never had.
    runs = graphql(port, STARTUP_RUNS, {})["runsOrError"]["results"]
    tags = [{t["key"]: t["value"] for t in run["tags"]} for run in runs]
    assert len(tags) == len(FREQUENCIES) and all(
        t.get("rota/started_by") == "rota dev" and "dagster/schedule_name" not in t for t in tags), tags
    # The queue's hours since the install: the live sensor delivers each, none is missing.
    wait_for(every_hour_delivered, 240, "scheduled_runs to have every hour since the install", interval=3)
    said = log.read_text()
    assert not [line for line in said.splitlines() if any(noise in line for noise in NOISE)], said[-3000:]


def _interrupt_and_check_nothing_is_left(process: subprocess.Popen, tree: Path, log: Path) -> None:
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground job
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"still running 90 s after Ctrl-C:\n{log.read_text()[-3000:]}")
    wait_for(lambda: not _processes_of(tree), 30, f"every process to end: {_processes_of(tree)}")
    assert "stopped the embedded PostgreSQL" in log.read_text()


def test_the_readmes_first_command_as_written_on_a_machine_that_never_ran_rota(tmp_path):
    start, _ = readme_commands()
    if not answers(3000) and not _port_free(3000):
        pytest.fail("port 3000, which the README's command serves on, is taken by something else")
    tree = _copy_tree(tmp_path / "rota")
    assert not (tree / ".rota").exists()
    log = tmp_path / "first-command.log"
    process = _run_until_serving(["bash", "-c", start], tree, _newcomer_env(), log, 3000, timeout=600)
    try:
        _check_demo_and_partitions(3000, _database_url(log), log)
    finally:
        _interrupt_and_check_nothing_is_left(process, tree, log)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_an_installed_rota_starts_from_an_empty_directory_with_an_empty_home(installed, tmp_path):
    """`pip install .` (tests/system/test_package.py's wheel), then `rota migrate` and `rota dev`."""
    _, python, _ = installed
    empty, home = tmp_path / "empty", tmp_path / "home"
    empty.mkdir()
    env = _newcomer_env(ROTA_HOME=str(home))
    migrated = subprocess.run([str(python), "-m", "rota.pipelines.cli", "migrate"], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=180)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "created the database rota" in migrated.stdout and not _processes_of(home)
    port = free_port()
    log = tmp_path / "installed-dev.log"
    process = _run_until_serving([str(python), "-m", "rota.pipelines.cli", "dev", "--port", str(port)], empty, env, log,
                                 port, timeout=300)
    try:
        _check_demo_and_partitions(port, _database_url(log), log)
    finally:
        _interrupt_and_check_nothing_is_left(process, home, log)
    assert list(empty.iterdir()) == []


def test_a_start_that_fails_stops_the_server_it_started(tmp_path):
    """A refusal after the embedded server started (here: the port of the UI is free but
    the migrations are refused) stops that server again."""
    home = tmp_path / "home"
    env = _newcomer_env(ROTA_HOME=str(home), PGOPTIONS="-c default_transaction_read_only=on")
    done = subprocess.run([sys.executable, "-m", "rota.pipelines.cli", "migrate"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode != 0 and "stopped the embedded PostgreSQL" in done.stdout, done.stdout + done.stderr
    assert not _processes_of(home), _processes_of(home)
