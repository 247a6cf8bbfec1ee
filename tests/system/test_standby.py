"""Two complete Dagster deployments on one rota database (issue 35): a hot standby.

Dagster supports one daemon per instance. rota's identities make a second deployment safe:
each has its own DAGSTER_HOME, instance storage, code server and daemon, both schedule and
deliver the same ticks (every minute here), and whatever both do exists once. One is then
SIGKILLed (daemon and code server) and the other goes on with no gap. Prints what the
deployment that finds every task existing costs against the one that made them."""

import os
import signal
import statistics
import subprocess
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from sqlalchemy import make_url, text

from benchmarks.data import load_duties
from rota.pipelines.cli.dev import DAEMON
from rota.pipelines.dispatch.completeness import find_gaps
from rota.pipelines.dispatch.planner import Mode
from rota.pipelines.periods.calendar import open_range, periods_between
from rota.pipelines.queue.jobs import register_job
from rota.resources.database.server import database_name, with_database
from tests.system.test_end_to_end import free_port, wait_for
from tests.system.test_package import installed  # noqa: F401 - a fixture
from tests.system.test_topology import ROOT, _stop

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DUTIES = 3_000
DISPATCH = "dispatch_daily_tasks"


def _storage_env(url: str) -> dict[str, str]:
    """deploy/dagster.yaml's variables for the storage database `url`."""
    parsed = make_url(url)
    socket_dir = parsed.query.get("host")
    return {"DAGSTER_PG_USERNAME": parsed.username, "DAGSTER_PG_PASSWORD": parsed.password or "",
            "DAGSTER_PG_HOST": "" if socket_dir else parsed.host, "DAGSTER_PG_PORT": str(parsed.port or 5432),
            "DAGSTER_PG_DB": parsed.database, **({"PGHOST": socket_dir} if socket_dir else {})}


class Deployment:
    """One Dagster deployment: a DAGSTER_HOME on deploy/dagster.yaml (the default run
    launcher in place of Docker's), a storage database, a code server and a daemon."""

    def __init__(self, name: str, python, database_url: str, storage_url: str, tmp_path):
        self.name, self.python, self.storage_url = name, python, storage_url
        self.home = tmp_path / name
        self.home.mkdir()
        config = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text())
        del config["run_launcher"]
        (self.home / "dagster.yaml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        (self.home / "workspace.yaml").write_text(yaml.safe_dump({"load_from": [{"grpc_server": {
            "host": "127.0.0.1", "port": self.port, "location_name": "rota"}}]}))
        # No PGTZ, as docs/deploy.md says of a Dagster process: the suite's (conftest) would win
        # over the storage's TimeZone=UTC, a run's create_timestamp would read hours old, and
        # the monitoring daemon failed one it met before its launch as "taking longer than
        # 300 seconds to start".
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ROTA_", "DAGSTER_")) and k != "PGTZ"},
                    "ROTA_DATABASE_URL": database_url, "DAGSTER_HOME": str(self.home),
                    "ROTA_HOME": str(self.home / "rota"), "ROTA_DISPATCH_CRON": "* * * * *",
                    **_storage_env(storage_url)}
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        cwd = self.home
        for name, command in (
                ("code-server", ["-m", "dagster", "code-server", "start", "-h", "127.0.0.1", "-p", str(self.port),
                                 "-m", "rota.pipelines.definitions", "--location-name", "rota"]),
                ("daemon", ["-c", DAEMON, "run", "-w", str(self.home / "workspace.yaml")])):
            log = open(self.home / f"{name}.log", "w")
            # Each in its own process group, so a kill reaches all it started at one instant.
            self.processes[name] = subprocess.Popen([str(self.python), *command], cwd=cwd, env=self.env,
                                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            if name == "code-server":
                wait_for(self.serving, 120, f"{self.name}'s code server")

    def serving(self) -> bool:
        assert self.processes["code-server"].poll() is None, self.said("code-server")
        return subprocess.run([str(self.python), "-m", "dagster", "api", "grpc-health-check", "-p", str(self.port)],
                              cwd=self.home, env=self.env, capture_output=True).returncode == 0

    def said(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text()[-3000:]

    def kill(self) -> None:
        """SIGKILL, daemon and code server with everything they started. The daemon goes
        first: a daemon that outlived its code server by a moment would fail the runs it
        was launching there, which is its own doing, not the kill's."""
        for name in ("daemon", "code-server"):
            os.killpg(self.processes[name].pid, signal.SIGKILL)
            self.processes[name].wait(timeout=20)

    @contextmanager
    def instance(self):
        """Its instance, read from this process: deploy/dagster.yaml takes the storage from
        the environment, set for as long as the instance is open."""
        storage = {key: self.env.get(key) for key in ("DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_HOST",
                                                      "DAGSTER_PG_PORT", "DAGSTER_PG_DB", "PGHOST")}
        saved = {key: os.environ.get(key) for key in storage}
        os.environ.update({key: value for key, value in storage.items() if value is not None})
        try:
            with DagsterInstance.from_config(str(self.home)) as instance:
                yield instance
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def dispatch_runs(self) -> list[tuple]:
        """Its daily dispatch runs: (tick, status, stats, tasks created)."""
        with self.instance() as instance:
            return [(r.run_config["ops"]["daily_tasks"]["config"]["as_of"], r.status,
                     instance.get_run_stats(r.run_id), _created(instance, r.run_id))
                    for r in instance.get_runs(RunsFilter(job_name=DISPATCH))]

    def failed_runs(self) -> list[str]:
        """Its failed or canceled runs, each with what its failure events said."""
        with self.instance() as instance:
            return [f"{self.name}: {r.job_name} {r.run_id}: " + " | ".join(
                        _failure(entry) for entry in instance.all_logs(r.run_id)
                        if entry.dagster_event and entry.dagster_event.is_failure)
                    for r in instance.get_runs(
                        RunsFilter(statuses=[DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]))]


def _failure(entry) -> str:
    error = getattr(entry.dagster_event.event_specific_data, "error", None)
    return f"{entry.message} {error.to_string() if error else ''}"


def _created(instance: DagsterInstance, run_id: str) -> int:
    made = 0
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event and event.event_type_value == "ASSET_MATERIALIZATION":
            value = event.event_specific_data.materialization.metadata.get("created")
            made += value.value if value is not None else 0
    return made


IN_FLIGHT = (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING,
             DagsterRunStatus.STARTED)


def _never_launched(run) -> bool:
    """A run its deployment made or queued but never handed to a launcher."""
    _, status, stats, _ = run
    return status in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED) and stats.launch_time is None


def _ticks(runs) -> set[datetime]:
    """The schedule ticks a deployment's successful dispatch runs served."""
    return {datetime.fromisoformat(tick) for tick, status, _, _ in runs if status == DagsterRunStatus.SUCCESS}


def test_two_deployments_on_one_database_stay_exactly_once_and_one_survives_the_others_kill(
        installed, database_url, engine, test_server, tmp_path, capsys):  # noqa: F811
    _, python, _ = installed
    load_duties(engine, DUTIES, frequencies=[("daily", 1)], max_lead=0)
    # Duties were loaded owed all along; the queue job owes fire times from now on.
    register_job(engine, "noop", schedule="* * * * *")
    storages = []
    for name in ("a", "b"):
        storage = f"{database_name(database_url)}_dagster_{name}"
        test_server.create(storage)
        storages.append(storage)
    a, b = (Deployment(name, python, database_url, with_database(database_url, storage), tmp_path)
            for name, storage in zip(("a", "b"), storages))
    started = datetime.now(timezone.utc)
    try:
        a.start()
        b.start()
        # Two ticks served by both, then A dies between ticks, and B serves two more alone.
        wait_for(lambda: len(_ticks(a.dispatch_runs()) & _ticks(b.dispatch_runs())) >= 2, 300,
                 "two ticks dispatched by both deployments", interval=5)
        wait_for(lambda: not [r for r in a.dispatch_runs() if r[1] in (DagsterRunStatus.STARTED,
                                                                        DagsterRunStatus.STARTING)],
                 120, "a pause between A's runs", interval=1)
        a.kill()
        killed = datetime.now(timezone.utc)
        alone = lambda: {t for t in _ticks(b.dispatch_runs()) if t > killed}  # noqa: E731
        wait_for(lambda: len(alone()) >= 2, 240, "two ticks dispatched by B alone", interval=5)
        ended = datetime.now(timezone.utc)
        runs_a, runs_b = a.dispatch_runs(), b.dispatch_runs()
        failed = a.failed_runs() + b.failed_runs()
    finally:
        _stop(list(a.processes.values()) + list(b.processes.values()))

    # No run of either failed; B's ticks go on after A's kill with none missing. A run A had
    # queued but not launched when it died did nothing, and only one for a tick after A's
    # last is that (B served its tick); B, still alive when read, may have the next tick's
    # run under way, and no other.
    assert failed == []
    served_b = sorted(_ticks(runs_b))
    after_a = max(_ticks(runs_a))
    assert [r for r in runs_a if r[1] != DagsterRunStatus.SUCCESS and not (
        _never_launched(r) and datetime.fromisoformat(r[0]) > after_a
        and datetime.fromisoformat(r[0]) in served_b)] == [], runs_a
    assert [r for r in runs_b if r[1] != DagsterRunStatus.SUCCESS and not (
        r[1] in IN_FLIGHT and datetime.fromisoformat(r[0]) == served_b[-1] + timedelta(minutes=1))] == [], runs_b
    assert all(later - earlier == timedelta(minutes=1) for earlier, later in zip(served_b, served_b[1:])), served_b
    # Every task once: each duty has its current period, and nothing twice.
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) - count(DISTINCT (duty_id, period_key)) FROM task")).scalar() == 0
    last = served_b[-1]
    assert find_gaps(engine, frequency="daily", mode=Mode.SCHEDULED, as_of=last,
                     requested=periods_between(*open_range("daily", last, 0))).count == 0
    # Every minute's fire time of the queue job queued once, across the kill.
    with engine.connect() as conn:
        fire_times = conn.execute(text(
            "SELECT scheduled_for, count(*) FROM job_queue WHERE scheduled_for >= :start AND scheduled_for < :end "
            "GROUP BY scheduled_for ORDER BY 1"), {"start": started + timedelta(minutes=1), "end": ended}).all()
    minutes = int((ended - started).total_seconds() // 60) - 1
    assert len(fire_times) >= minutes and all(n == 1 for _, n in fire_times), fire_times
    # The standby's cost: a tick's run that made the tasks against one that found them all.
    succeeded = [(s, n) for _, status, s, n in runs_a + runs_b if status == DagsterRunStatus.SUCCESS]
    made = [s.end_time - s.start_time for s, n in succeeded if n > 0]
    found = [s.end_time - s.start_time for s, n in succeeded if n == 0]
    assert made and found
    for storage in storages:
        test_server.drop(storage)
    with capsys.disabled():
        print(f"\nstandby: {len(runs_a)} dispatch runs on A, {len(runs_b)} on B, none failed; the run that made "
              f"{DUTIES:,} tasks took {statistics.median(made):.2f} s, a run that found them all existing "
              f"{statistics.median(found):.2f} s (median of {len(found)}; ratio "
              f"{statistics.median(found) / statistics.median(made):.2f})")
