"""The `rota` command at its edges: a taken port, a worker without a database, `rota psql`."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import make_url

from rota.resources.database.server import ensure_database, start_embedded, stop_embedded

ROTA = str(Path(sys.executable).parent / "rota")


def _env(tmp_path, **extra):
    env = {key: value for key, value in os.environ.items() if key != "ROTA_DATABASE_URL"}
    return {**env, "ROTA_HOME": str(tmp_path / "home"), **extra}


def test_a_second_rota_dev_refuses_a_taken_port_at_once_and_starts_nothing(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([ROTA, "dev", "--port", str(port)], env=_env(tmp_path), capture_output=True,
                              text=True, timeout=60)
    assert time.monotonic() - started < 20
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stdout
    assert f"--port {port + 1}" in done.stdout
    assert not (tmp_path / "home" / "pgdata").exists()  # not even the database was started


def test_rota_worker_without_a_database_says_so_and_starts_nothing(tmp_path):
    done = subprocess.run([ROTA, "worker"], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "rota worker needs a database: set ROTA_DATABASE_URL" in done.stdout
    assert not (tmp_path / "home" / "pgdata").exists()


def test_rota_psql_opens_rotas_database(database_url, tmp_path):
    done = subprocess.run([ROTA, "psql", "-At", "-c", "SELECT count(*) FROM duty"],
                          env=_env(tmp_path, ROTA_DATABASE_URL=database_url), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    # psql's own options are psql's: -U takes another role on the same database.
    done = subprocess.run([ROTA, "psql", "-U", "rota_app", "-At", "-c", "SELECT current_user, current_database()"],
                          env=_env(tmp_path, ROTA_DATABASE_URL=database_url), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"rota_app|{make_url(database_url).database}"


def test_rota_psql_where_rota_never_ran_says_so_and_makes_nothing(tmp_path):
    done = subprocess.run([ROTA, "psql", "-c", "SELECT 1"], env=_env(tmp_path), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"no rota database in {tmp_path / 'home'}" in done.stdout and "ROTA_HOME" in done.stdout
    assert not (tmp_path / "home").exists()


def test_a_rota_home_from_an_earlier_rota_is_refused_saying_what_to_do(tmp_path):
    """An earlier rota dev made its databases as the embedded server's superuser; this one
    works as rota_owner and says so rather than half-working on them."""
    datadir = tmp_path / "home" / "pgdata"
    datadir.parent.mkdir()
    ensure_database(start_embedded(datadir))  # the rota database, as the superuser made it
    try:
        done = subprocess.run([ROTA, "migrate"], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    finally:
        stop_embedded(datadir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "made by an earlier rota" in done.stdout and f"move {tmp_path / 'home'} away" in done.stdout


def test_rota_worker_starts_without_importing_dagster(database_url, tmp_path):
    """A worker's start-up is paid again at every deploy and by every one of a fleet:
    its handlers and the queue need no Dagster, whose import alone costs more CPU than
    a thousand runs."""
    # To a file, not a pipe: Dagster's thousands of import lines would fill a pipe and stall the worker.
    imports = tmp_path / "imports.txt"
    with imports.open("w") as stderr:
        worker = subprocess.Popen([ROTA, "worker"], env=_env(tmp_path, ROTA_DATABASE_URL=database_url,
                                                             PYTHONPROFILEIMPORTTIME="1"),
                                  stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            assert "started" in worker.stdout.readline()
        finally:
            worker.terminate()
            worker.communicate(timeout=60)
    assert worker.returncode == 0
    imported = {line.split("|")[-1].strip() for line in imports.read_text().splitlines() if line.startswith("import time:")}
    # importlib.import_module's own module goes unlogged; the nightly handler's imports show it ran
    assert {"rota.resources.maintenance", "rota.pipelines.queue.worker"} <= imported
    assert not {name for name in imported if name.split(".")[0] == "dagster"}
