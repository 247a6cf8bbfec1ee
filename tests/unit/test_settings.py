"""Each settings object reads its variables from the environment once, under the names
`rota --help` lists, and keeps its declared default for a variable that is unset."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import EnvVar

from rota.resources.alerts import AlertWebhookResource, alerts_from_env
from rota.resources.github import GitHubResource, github_from_env
from rota.resources.maintenance import MaintenanceSettings, maintenance_settings_from_env
from rota.resources.postgres import PostgresResource, postgres_from_env
from rota.resources.scheduling import (
    DispatchSchedule,
    SchedulingSettings,
    dispatch_schedule_from_env,
    scheduling_settings_from_env,
)
from rota.resources.settings import declared, whole_number

OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"

READ = {
    "ROTA_DISPATCH_WRITERS": ("5", lambda: postgres_from_env().dispatch_writers, 5),
    "ROTA_DISPATCH_CRON": ("*/5 * * * *", lambda: dispatch_schedule_from_env().cron, "*/5 * * * *"),
    "ROTA_SCHEDULE_CATCHUP_MINUTES": ("7", lambda: scheduling_settings_from_env().catch_up_minutes, 7),
    "ROTA_SCHEDULE_LOOKAHEAD_MINUTES": ("90", lambda: scheduling_settings_from_env().lookahead_minutes, 90),
    "ROTA_QUEUE_MAX_WAIT_SECONDS": ("45", lambda: scheduling_settings_from_env().max_wait_seconds, 45),
    "ROTA_RETENTION_DAYS": ("30", lambda: maintenance_settings_from_env().retention_days, 30),
    "ROTA_GITHUB_API_URL": ("http://127.0.0.1:9", lambda: github_from_env().api_url, "http://127.0.0.1:9"),
    "ROTA_GITHUB_REPOSITORIES": ("octo/cat", lambda: github_from_env().repositories, "octo/cat"),
}


@pytest.mark.parametrize("variable", READ)
def test_each_variable_sets_its_field(monkeypatch, variable):
    raw, read, expected = READ[variable]
    monkeypatch.setenv(variable, raw)
    assert read() == expected


def test_the_secrets_are_passed_by_name_and_an_empty_one_is_unset(monkeypatch):
    monkeypatch.setenv("ROTA_GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("ROTA_ALERT_WEBHOOK_URL", "")
    assert github_from_env().token == EnvVar("ROTA_GITHUB_TOKEN")
    assert alerts_from_env().url is None


def test_unset_variables_leave_the_declared_defaults(monkeypatch):
    for variable in READ:
        monkeypatch.delenv(variable, raising=False)
    assert scheduling_settings_from_env() == type(scheduling_settings_from_env())()
    assert maintenance_settings_from_env() == MaintenanceSettings()
    assert dispatch_schedule_from_env() == DispatchSchedule()


def test_the_dispatch_schedules_tick_on_the_variables_cron():
    """Read once, as the code location loads: in a process of its own, with the variable set."""
    shown = subprocess.run(
        [sys.executable, "-c", "from rota.schedules.dispatch import DISPATCH_SCHEDULES\n"
                               "for s in DISPATCH_SCHEDULES: print(s.name, s.cron_schedule)"],
        env={**os.environ, "ROTA_DISPATCH_CRON": "7 * * * *"}, capture_output=True, text=True, check=True).stdout
    ticks = dict(line.split(" ", 1) for line in shown.splitlines())
    assert len(ticks) == 5 and set(ticks.values()) == {"7 * * * *"}, shown


@pytest.mark.parametrize("variable, raw, expected", [
    ("ROTA_SCHEDULE_CATCHUP_MINUTES", "fifteen", "ROTA_SCHEDULE_CATCHUP_MINUTES must be a whole number, not 'fifteen'"),
    ("ROTA_RETENTION_DAYS", "-1", "ROTA_RETENTION_DAYS must be a whole number, not '-1'"),
    ("ROTA_RETENTION_DAYS", "4\u00b2", "ROTA_RETENTION_DAYS must be a whole number, not '4\u00b2'"),
])
def test_a_variable_that_is_not_a_whole_number_is_refused_by_name(monkeypatch, variable, raw, expected):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ValueError, match=expected):
        READ[variable][1]()


def test_a_whole_number_says_the_range_it_wanted():
    assert whole_number("3", 1, 7) == 3
    with pytest.raises(ValueError, match="must be a whole number of at least 1, not '0'"):
        whole_number("0", 1)


def test_the_operators_table_of_variables_says_the_declared_defaults():
    """docs/operating.md is read without rota at hand, so it states the defaults again:
    held here to the declarations it repeats."""
    table = {}
    for line in OPERATING.read_text().splitlines():
        if line.startswith("| `ROTA_"):
            variable, default = (cell.strip() for cell in line.strip("|").split("|")[:2])
            table[variable.strip("`")] = default
    for settings in (PostgresResource, DispatchSchedule, SchedulingSettings, MaintenanceSettings,
                     AlertWebhookResource, GitHubResource):
        for setting in declared(settings):
            expected = "none" if setting.default in (None, "") else f"`{setting.default}`"
            assert table.get(setting.env) == expected, (setting.env, table.get(setting.env))
