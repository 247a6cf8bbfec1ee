"""`rota dev`: the embedded database with demo data, one code server, the Dagster
webserver and daemon, and queue workers, until Ctrl-C."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import create_engine

from rota.pipelines.cli.database import Database, say
from rota.pipelines.cli.demo import load_demo
from rota.resources.database.migrate import upgrade
from rota.resources.database.server import Refused, dagster_database_url, driver_url, ensure_database, rota_home

DAGSTER_YAML = """\
# Written by `rota dev`. Instance storage lives in its own database on rota's server.
storage:
  postgres:
    postgres_url:
      env: ROTA_DAGSTER_STORAGE_URL
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
telemetry:
  enabled: false
# The UI's first-visit "Join the community" dialog, which stands between a new operator and
# the catalog.
nux:
  enabled: false
"""


def dagster_storage_url(storage_url: str) -> str:
    """The URL Dagster's instance storage connects with: psycopg2 (driver_url says why),
    its sessions in UTC. Dagster stores naive CURRENT_TIMESTAMPs and reads them as UTC, and
    the embedded server runs in the zone of whoever started it."""
    url = driver_url(storage_url, "psycopg2")
    return url.update_query_dict({"options": "-c TimeZone=UTC"}).render_as_string(hide_password=False)


def _reset_signals() -> None:
    # A process started from a shell script's background job inherits SIGINT ignored,
    # and dagster copies that onto SIGTERM; restore both so our SIGTERM stops the tree.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop_tree(process: subprocess.Popen, grace: float = 20.0) -> None:
    import psutil

    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for member in tree:
        try:
            member.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=grace)
    for member in alive:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def prepare(database: Database) -> None:
    """Migrate; and into the embedded database only, and only while it is empty, load the
    demo data. A database named by ROTA_DATABASE_URL is never given demo data."""
    upgrade(database.url)
    if not database.embedded:
        return
    engine = create_engine(driver_url(database.url))
    try:
        loaded = load_demo(engine)
    finally:
        engine.dispose()
    if loaded:
        say(f"loaded {loaded} demo duties and the demo cron job noop")


def _port_taken(host: str, port: int) -> bool:
    """Whether something already listens on host:port (bound the way the webserver binds)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


# `dagster-daemon`: Dagster's console script, run through this interpreter like the other
# children (Dagster has no `-m` module for it but a private one).
DAEMON = ("import sys; from importlib.metadata import entry_points; sys.argv[0] = 'dagster-daemon'; "
          "sys.exit(entry_points(group='console_scripts', name='dagster-daemon')['dagster-daemon'].load()())")

# Says which runs `rota dev` made itself, in the runs list where a schedule's name would be.
STARTED_BY_TAG = "rota/started_by"

WORKSPACE_YAML = """\
# Written by `rota dev`: the webserver and the daemon share one code server, as in production.
load_from:
  - grpc_server:
      host: 127.0.0.1
      port: {port}
      location_name: rota
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# A check starts a Python that imports Dagster: seconds on a small machine, beside the code
# server it asks.
HEALTH_CHECK_TIMEOUT = 60


def _serving(port: int) -> bool:
    """Whether the code server answers Dagster's health check, the one its Helm chart probes
    with (asked only once the port listens: each ask costs a Python start)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    check = [sys.executable, "-m", "dagster", "api", "grpc-health-check", "-h", "127.0.0.1", "-p", str(port)]
    try:
        return subprocess.run(check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=HEALTH_CHECK_TIMEOUT).returncode == 0
    except subprocess.TimeoutExpired:  # a server still loading may not answer: asked again
        return False


def dispatch_once(now: datetime) -> int:
    """Run the five dispatch schedules' runs of their last tick, as the daemon would have:
    a fresh install shows its tasks at once, not from the next top of the hour. A re-run of
    a tick creates nothing (SPEC §4), so a restart only records five more runs. Returns the
    tasks created."""
    from croniter import croniter
    from dagster import DagsterInstance

    from rota.pipelines.definitions import defs
    from rota.pipelines.periods.partitions import DISPATCH_CRON, task_asset_name
    from rota.resources.database.schema import FREQUENCIES
    from rota.schedules.dispatch import DISPATCH_JOBS, scheduled_run_request

    tick = croniter(DISPATCH_CRON, now).get_prev(datetime)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    created = 0
    with DagsterInstance.get() as instance:
        for frequency in FREQUENCIES:
            # The tick's run, but not the schedule's: Dagster records no tick for it, so it
            # is not tagged as one, and says where it came from instead.
            request = scheduled_run_request(frequency, tick)
            result = defs.resolve_job_def(DISPATCH_JOBS[frequency].name).execute_in_process(
                instance=instance, run_config={**request.run_config, **quiet},
                tags={**request.tags, STARTED_BY_TAG: "rota dev"}, raise_on_error=False)
            if not result.success:
                raise Refused(f"the first dispatch of {frequency} tasks failed: see run {result.run_id} in the UI")
            created += sum(m.metadata["created"].value
                           for m in result.asset_materializations_for_node(task_asset_name(frequency)))
            created += sum(o.metadata["created_ahead"].value
                           for o in result.asset_observations_for_node(task_asset_name(frequency)))
    return created


class _Children:
    """The processes `rota dev` started, and whether a signal asked it to stop: a Ctrl-C
    while one is still starting stops the start, not just the wait after it."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen] = []
        self.stop_requested = False

    def request_stop(self, signum, _frame) -> None:
        self.stop_requested = True

    def running(self) -> bool:
        return not self.stop_requested and all(child.poll() is None for child in self.processes)

    def start(self, *command: str, output=None) -> None:
        self.processes.append(subprocess.Popen(command, preexec_fn=_reset_signals, start_new_session=True,
                                               stdout=output, stderr=output))

    def stop(self) -> None:
        for child in reversed(self.processes):
            _stop_tree(child)


# This interpreter's packages, wherever its scripts were put.
PYTHON = [sys.executable, "-m"]


def _configure_dagster(database: Database) -> tuple[Path, int]:
    """Dagster's instance storage on rota's server, its home under ROTA_HOME and the
    environment the children inherit; returns that home and the code server's port."""
    storage_url = dagster_database_url(database.url)
    ensure_database(storage_url)
    dagster_home = rota_home() / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)
    code_port = _free_port()
    (dagster_home / "workspace.yaml").write_text(WORKSPACE_YAML.format(port=code_port))
    os.environ.update({
        "ROTA_DATABASE_URL": database.url,
        "ROTA_DAGSTER_STORAGE_URL": dagster_storage_url(storage_url),
        "DAGSTER_HOME": str(dagster_home),
    })
    return dagster_home, code_port


def _load_code_server(children: _Children, dagster_home: Path, code_port: int) -> int | None:
    """Start the code server and wait until it serves: None then, else `rota dev`'s exit
    status (0 when asked to stop meanwhile, 1 when the server died, its log's end said)."""
    # One code server that the webserver and the daemon share (the installed package's
    # definitions, from any directory), as the Helm chart runs it. The runs it launches
    # print every event; the UI shows them, so here they go to a file.
    code_log = open(dagster_home / "code-server.log", "ab")  # noqa: SIM115 - the child's for its life
    children.start(*PYTHON, "dagster", "code-server", "start", "-h", "127.0.0.1", "-p", str(code_port),
                   "-m", "rota.pipelines.definitions", "--location-name", "rota", "--log-level", "warning",
                   output=code_log)
    code_log.close()
    say("loading the code location rota")
    while children.running() and not _serving(code_port):
        time.sleep(0.5)
    if children.stop_requested:
        return 0
    if not children.running():
        said = (dagster_home / "code-server.log").read_text(errors="replace")[-3000:]
        say(f"the code server stopped while loading the definitions:\n{said}")
        return 1
    return None


def _start_ui_daemon_and_workers(children: _Children, args: argparse.Namespace, workspace: Path) -> None:
    children.start(*PYTHON, "dagster_webserver", "-w", str(workspace), "-h", args.host, "-p", str(args.port))
    # The daemon's per-tick INFO lines only at --log-level info.
    children.start(sys.executable, "-c", DAEMON, "run", "-w", str(workspace), "--log-level", args.log_level)
    # Every worker claims every job's runs: one without the user's handlers would take
    # their runs and fail them for want of one.
    handlers = ["--handlers", args.handlers] if args.handlers else []
    for _ in range(args.workers):
        children.start(*PYTHON, "rota.pipelines.cli", "worker", *handlers)


def dev(args: argparse.Namespace) -> int:
    if _port_taken(args.host, args.port):
        say(f"port {args.port} on {args.host} is already in use (another rota dev?); nothing was started. "
             f"Choose another port with --port, for example: rota dev --port {args.port + 1}")
        return 2
    database = Database()
    children = _Children()
    signal.signal(signal.SIGINT, children.request_stop)
    signal.signal(signal.SIGTERM, children.request_stop)
    try:
        prepare(database)
        dagster_home, code_port = _configure_dagster(database)
        if children.stop_requested:
            return 0
        failed = _load_code_server(children, dagster_home, code_port)
        if failed is not None:
            return failed
        say(f"dispatched the last tick: {dispatch_once(datetime.now(timezone.utc))} tasks created "
             f"(then every hour on the hour)")
        _start_ui_daemon_and_workers(children, args, dagster_home / "workspace.yaml")
        say(f"database {database.url} (open a SQL prompt with: rota psql)")
        say(f"run logs: in the UI, and in {dagster_home / 'code-server.log'}")
        say(f"Dagster UI and daemon starting on http://{args.host}:{args.port}, {args.workers} "
             "worker(s) claiming queued runs (Ctrl-C stops everything)")
        while children.running():
            time.sleep(0.2)
        return 0 if children.stop_requested else 1
    finally:
        children.stop()
        database.close()
