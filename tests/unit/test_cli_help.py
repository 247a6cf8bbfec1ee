"""`rota <command> --help` states each option's real default and never a stored one that
reads as the opposite (issue 39: `--no-listen … (default: True)`), and the defaults and
variables it lists are those of the settings objects that read them (issue 40), a worker's
no more than it reads; a handler module that is not there is refused by name before a
database is needed."""

import argparse
import re
import subprocess
import sys
from datetime import timedelta

import pytest

from rota.pipelines.cli.main import main
from rota.pipelines.cli.options import add_options, settings_from
from rota.pipelines.queue.worker_settings import WorkerSettings
from rota.resources.alerts import AlertWebhookResource
from rota.resources.github import GitHubResource
from rota.resources.maintenance import MaintenanceSettings
from rota.resources.postgres import PostgresResource
from rota.resources.scheduling import DispatchSchedule, SchedulingSettings
from rota.resources.settings import declared

COMMANDS = ["migrate", "dev", "history-start", "psql", "worker"]


@pytest.mark.parametrize("command", COMMANDS)
def test_no_option_shows_a_default_it_does_not_have(command):
    done = subprocess.run([sys.executable, "-m", "rota.pipelines.cli", command, "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    help_text = " ".join(done.stdout.split())
    assert not re.search(r"\(default: (True|False|None)\)", help_text), help_text


def test_the_worker_says_it_listens_unless_told_not_to():
    done = subprocess.run([sys.executable, "-m", "rota.pipelines.cli", "worker", "--help"], capture_output=True,
                          text=True, timeout=60)
    help_text = " ".join(done.stdout.split())
    assert "--no-listen poll only; do not LISTEN for queued runs" in help_text
    assert "(default: $ROTA_WORKER_HANDLERS)" in help_text


def test_a_worker_refuses_a_handler_module_it_cannot_find_by_name(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "ROTA_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    done = subprocess.run([sys.executable, "-m", "rota.pipelines.cli", "worker", "--handlers", "myapp.handlers"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "refused to start: no module 'myapp.handlers'" in done.stdout, done.stdout + done.stderr


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_worker_options_show_the_worker_settings_defaults(capsys):
    """The flags are the interface; their defaults are WorkerSettings', so a default changed
    there is the one `rota worker --help` shows and `rota worker` runs with."""
    defaults = WorkerSettings()
    shown = {"--lease": defaults.lease.total_seconds(), "--grace": defaults.grace.total_seconds(),
             "--poll": defaults.poll_interval, "--backoff": defaults.backoff.total_seconds(),
             "--concurrency": defaults.concurrency}
    help_text = _help(capsys, "worker")
    for flag, default in shown.items():
        assert re.search(rf"{flag} {flag[2:].upper()} [^(]*\(default: {default}\)", help_text), (flag, help_text)


def test_rota_worker_without_options_runs_with_the_worker_settings_defaults():
    parser = argparse.ArgumentParser()
    add_options(parser, WorkerSettings)
    assert settings_from(WorkerSettings, parser.parse_args([])) == WorkerSettings()
    given = settings_from(WorkerSettings, parser.parse_args(["--lease", "2.5", "--no-listen", "--concurrency", "4"]))
    assert given == WorkerSettings(lease=timedelta(seconds=2.5), listen=False, concurrency=4)


# Each variable the code location and its workers read, and its default as the settings
# object that reads it has it.
VARIABLES = {
    "ROTA_DISPATCH_WRITERS": lambda: PostgresResource(database_url="postgresql:///rota").dispatch_writers,
    "ROTA_DISPATCH_CRON": lambda: DispatchSchedule().cron,
    "ROTA_SCHEDULE_CATCHUP_MINUTES": lambda: SchedulingSettings().catch_up_minutes,
    "ROTA_SCHEDULE_LOOKAHEAD_MINUTES": lambda: SchedulingSettings().lookahead_minutes,
    "ROTA_QUEUE_MAX_WAIT_SECONDS": lambda: SchedulingSettings().max_wait_seconds,
    "ROTA_RETENTION_DAYS": lambda: MaintenanceSettings().retention_days,
    "ROTA_ALERT_WEBHOOK_URL": lambda: AlertWebhookResource().url,
    "ROTA_GITHUB_TOKEN": lambda: GitHubResource().token,
    "ROTA_GITHUB_API_URL": lambda: GitHubResource().api_url,
    "ROTA_GITHUB_REPOSITORIES": lambda: GitHubResource().repositories or None,
}


@pytest.mark.parametrize("variable", VARIABLES)
def test_rota_dev_lists_each_variable_with_the_default_its_settings_have(capsys, variable):
    help_text = _help(capsys, "dev")
    described = help_text.split(f" {variable} ", 1)[1].split(" ROTA_", 1)[0]
    default = VARIABLES[variable]()
    if default is None:
        assert "default" not in described, described
    else:
        assert re.search(rf"\((\d+ to \d+, )?default: {re.escape(str(default))}\)", described), described


def test_a_worker_lists_what_its_nightly_maintenance_reads(capsys):
    assert f"ROTA_RETENTION_DAYS days a finished queue run keeps its payload and error (default: " \
           f"{MaintenanceSettings().retention_days})" in _help(capsys, "worker")


def test_a_worker_lists_only_the_variables_it_reads(capsys):
    """A worker requires ROTA_DATABASE_URL and never falls back to the embedded PostgreSQL
    that ROTA_HOME locates, so ROTA_HOME is not among its variables; every other command
    may start that server and lists it."""
    environment = _help(capsys, "worker").split(" environment: ", 1)[1]
    assert set(re.findall(r"\bROTA_[A-Z_]+", environment)) == {
        "ROTA_DATABASE_URL", "ROTA_WORKER_HANDLERS", *(setting.env for setting in declared(MaintenanceSettings))}
    for command in ("migrate", "dev", "history-start", "psql"):
        assert "ROTA_HOME local state" in _help(capsys, command), command
