"""The `rota` console command."""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine

from pipelines import migrations
from pipelines.demo import load_demo
from resources.server import (
    PROJECT_ROOT,
    dagster_database_url,
    driver_url,
    embedded_datadir,
    embedded_running,
    ensure_database,
    rota_home,
    start_embedded,
    stop_embedded,
)

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
"""


def _say(message: str) -> None:
    print(f"rota: {message}", flush=True)


class Database:
    """The database rota uses, and whether this command started the embedded server."""

    def __init__(self) -> None:
        self.url = os.environ.get("ROTA_DATABASE_URL")
        self.started_embedded = False
        if not self.url:
            datadir = embedded_datadir()
            self.started_embedded = not embedded_running(datadir)
            self.url = start_embedded(datadir)
            _say(f"embedded PostgreSQL in {datadir}")
        if ensure_database(self.url):
            _say("created the rota database")

    def close(self) -> None:
        if self.started_embedded:
            stop_embedded(embedded_datadir())
            _say("stopped the embedded PostgreSQL")


def migrate(_: argparse.Namespace) -> int:
    database = Database()
    try:
        migrations.upgrade(database.url)
        _say("migrations applied")
    finally:
        database.close()
    return 0


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


def dev(args: argparse.Namespace) -> int:
    database = Database()
    dagster = None
    stop = {"requested": False}

    def request_stop(signum, _frame):
        stop["requested"] = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        migrations.upgrade(database.url)
        engine = create_engine(driver_url(database.url))
        loaded = load_demo(engine)
        engine.dispose()
        if loaded:
            _say(f"loaded {loaded} demo duties")
        storage_url = dagster_database_url(database.url)
        ensure_database(storage_url)
        dagster_home = rota_home() / "dagster"
        dagster_home.mkdir(parents=True, exist_ok=True)
        (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)
        env = {
            **os.environ,
            "ROTA_DATABASE_URL": database.url,
            "ROTA_DAGSTER_STORAGE_URL": driver_url(storage_url, "psycopg2").render_as_string(hide_password=False),
            "DAGSTER_HOME": str(dagster_home),
        }
        command = [str(Path(sys.executable).parent / "dagster"), "dev",
                   "-w", str(PROJECT_ROOT / "workspace.yaml"), "-h", args.host, "-p", str(args.port)]
        if stop["requested"]:
            return 0
        dagster = subprocess.Popen(command, env=env, cwd=PROJECT_ROOT, preexec_fn=_reset_signals,
                                   start_new_session=True)
        _say(f"Dagster UI and daemon starting on http://{args.host}:{args.port} (Ctrl-C stops everything)")
        while not stop["requested"] and dagster.poll() is None:
            time.sleep(0.2)
        return 0 if stop["requested"] else (dagster.returncode or 1)
    finally:
        if dagster is not None:
            _stop_tree(dagster)
        database.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rota", description="Recurring work, produced exactly once per period.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("migrate", help="apply every migration to the database (idempotent)").set_defaults(run=migrate)
    dev_parser = commands.add_parser("dev", help="start the Dagster UI and daemon with demo data")
    dev_parser.add_argument("--host", default="127.0.0.1")
    dev_parser.add_argument("--port", type=int, default=3000)
    dev_parser.set_defaults(run=dev)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
