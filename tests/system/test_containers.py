"""The production files, really started (issue 35): deploy/Dockerfile built on a Debian base
made by mmdebstrap (no registry is reachable here), deploy/docker-compose.yml brought up
service by service (tests/system/compose.py), the migrate step first, the daemon's hourly
schedule (every minute here) launching a dispatch run through DockerRunLauncher in a
container of its own, and a `rota worker` container draining a queued run.

Skips, naming why, only where dockerd cannot be reached or started, or mmdebstrap is
missing. Prints the image's size and the time from `up` to the first dispatched task."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.system.compose import Project, docker

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = "rota-test-base:bookworm"
POSTGRES = "rota-test-postgres:15"
IMAGE = "rota:0.1.0"
DUTIES = 500


def _dockerd() -> None:
    """A reachable dockerd, started here if this machine has one that is not running."""
    if not shutil.which("docker"):
        pytest.skip("no docker client: apt-get install docker.io")
    if docker("info", check=False, timeout=60).returncode == 0:
        return
    if not shutil.which("dockerd") or os.geteuid() != 0:
        pytest.skip("dockerd is not running and cannot be started here (needs docker.io and root)")
    (ROOT / ".rota").mkdir(exist_ok=True)
    log = open(ROOT / ".rota" / "dockerd.log", "ab")
    subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    for _ in range(60):
        if docker("info", check=False, timeout=60).returncode == 0:
            return
        time.sleep(1)
    pytest.skip(f"dockerd did not start: see {ROOT / '.rota' / 'dockerd.log'}")


def _debian_image(tag: str, packages: str, dockerfile: str, context: Path) -> None:
    """`tag`, built FROM a Debian bookworm made by mmdebstrap with `packages`."""
    if docker("image", "inspect", tag, check=False).returncode == 0:
        return
    if not shutil.which("mmdebstrap"):
        pytest.skip("mmdebstrap is missing: apt-get install mmdebstrap")
    base = f"{tag}-base"
    made = subprocess.run(f"mmdebstrap --quiet --variant=minbase --include={packages} bookworm - "
                          f"| docker import - {base}", shell=True, capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    context.mkdir(parents=True, exist_ok=True)
    (context / "Dockerfile").write_text(dockerfile.format(base=base))
    docker("build", "-q", "-t", tag, str(context), timeout=900)


def _image(tmp_path: Path) -> float:
    """Build deploy/Dockerfile as docs/deploy.md says, on the mmdebstrap base, from wheels that pip
    fetched on this machine (the build's own network has no index it could trust); returns
    the build's seconds."""
    _debian_image(BASE, "python3,python3-venv,ca-certificates,passwd", "FROM {base}\n", tmp_path / "base")
    context = tmp_path / "context"
    context.mkdir()
    for name in ("pyproject.toml", "README.md", "pipelines", "resources", "schedules", "sql"):
        origin = ROOT / name
        (shutil.copytree if origin.is_dir() else shutil.copy)(
            origin, context / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if origin.is_dir() else {}))
    (context / "deploy").mkdir()
    for name in ("Dockerfile", "dagster.yaml"):
        shutil.copy(DEPLOY / name, context / "deploy" / name)
    wheels = context / "deploy" / "wheels"
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "-d", str(wheels),
                              ".", "setuptools>=68", "dagster-docker==0.29.27", "dagster-k8s==0.29.27"],
                             cwd=context, capture_output=True, text=True, timeout=900)
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    started = time.monotonic()
    docker("build", "-q", "-f", "deploy/Dockerfile", "--build-arg", f"BASE={BASE}", "--build-arg", "OFFLINE=1",
           "-t", IMAGE, str(context), timeout=1800)
    return time.monotonic() - started


def _psql(project: Project, database: str, statement: str) -> str:
    return docker("exec", project.container("postgres"), "psql", "-U", "postgres", "-d", database, "-tAc",
                  statement).stdout.strip()


def _until(what: str, probe, timeout: float, project: Project, services: list[str]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(2)
    logs = "\n".join(f"--- {name}\n{project.logs(name)}" for name in services)
    raise AssertionError(f"{what}: not within {timeout} s\n{logs}")


def test_the_image_and_the_compose_file_dispatch_through_docker_run_containers(tmp_path, capsys):
    _dockerd()
    build_seconds = _image(tmp_path)
    (tmp_path / "postgres").mkdir()
    shutil.copy(Path(__file__).parent / "containers" / "postgres-entrypoint.sh", tmp_path / "postgres")
    _debian_image(POSTGRES, "postgresql-15,postgresql-client-15",
                  "FROM {base}\nCOPY postgres-entrypoint.sh /usr/local/bin/\n"
                  'ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]\n', tmp_path / "postgres")
    size_mb = int(docker("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout) / 1e6

    socket_group = str(os.stat("/var/run/docker.sock").st_gid)
    every_minute = {"ROTA_DISPATCH_CRON": "* * * * *"}
    project = Project(DEPLOY / "docker-compose.yml", environ={"DOCKER_GID": socket_group},
                      images={"postgres": POSTGRES},
                      extra_env={"code-server": every_minute, "daemon": every_minute, "webserver": every_minute})
    project.down()
    started = time.monotonic()
    try:
        project.up()
        _psql(project, "rota", f"""
            INSERT INTO duty (workspace_id, title, kind, frequency, timezone)
            SELECT gen_random_uuid(), 'duty ' || n, 'recurring', 'daily', 'UTC' FROM generate_series(1, {DUTIES}) n;
            INSERT INTO job (name, event_type) VALUES ('noop', 'compose.ping');
            INSERT INTO event (type, payload) VALUES ('compose.ping', '{{}}');""")
        services = ["daemon", "code-server", "worker-1", "worker-2"]
        _until("a task dispatched", lambda: int(_psql(project, "rota", "SELECT count(*) FROM task")),
               240, project, services)
        first_task = time.monotonic() - started
        runs = _until("the dispatch run succeeded in Dagster's storage", lambda: _psql(
            project, "rota_dagster",
            "SELECT string_agg(status, ',') FROM runs WHERE pipeline_name = 'dispatch_daily_tasks' "
            "AND status = 'SUCCESS'"), 240, project, services)
        assert "SUCCESS" in runs
        # Each run ran in a container of its own, from the code server's image.
        launched = int(_psql(project, "rota_dagster", "SELECT count(*) FROM run_tags WHERE key = 'docker/container_id'"))
        assert launched >= 1
        assert int(_psql(project, "rota", "SELECT count(DISTINCT duty_id) FROM task")) == DUTIES
        assert int(_psql(project, "rota", "SELECT count(*) - count(DISTINCT (duty_id, period_key)) FROM task")) == 0
        _until("the worker drained the queued run", lambda: _psql(
            project, "rota", "SELECT state FROM job_queue q JOIN job j ON j.id = q.job_id "
                             "WHERE j.name = 'noop' AND q.state = 'succeeded'"), 120, project, services)
    finally:
        project.down()
    with capsys.disabled():
        print(f"\nimage {IMAGE}: {size_mb:.0f} MB, built in {build_seconds:.0f} s; first dispatched task "
              f"{first_task:.0f} s after up (the schedule ticks each minute here); {launched} runs launched "
              f"in containers of their own")
