"""rota's Python surface (`from rota.pipelines import …`, pipelines/__init__.py) through every
name it is documented under: a handler registered through any of them is run by a real
`rota worker`, and each name hands out the same objects (issue 36: through the checkout's
names, 2,000 runs of a correct handler all ended failed)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rota.pipelines
import rota.pipelines.queue
from rota.pipelines import make_engine, produce, register_job
from tests.queue.test_queue import runs, stop, wait_for

ROOT = Path(__file__).resolve().parents[2]
# Installed (any directory) and from a checkout (SPEC's and workspace.yaml's names).
NAMES = ["rota.pipelines", "rota.pipelines.queue", "rota.pipelines.queue.handlers",
         "pipelines", "pipelines.queue", "pipelines.queue.handlers"]


def test_the_surface_is_one_object_per_name():
    """Every name of the surface is on both roots, every name of the queue's part on both
    queue names, and each is the very object `rota.pipelines` exports."""
    done = subprocess.run([sys.executable, "-c", (
        "import importlib, rota.pipelines as surface, rota.pipelines.queue as queue\n"
        "wrong = []\n"
        "for module, names in (('rota.pipelines', surface.__all__), ('pipelines', surface.__all__),\n"
        "                      ('rota.pipelines.queue', queue.__all__), ('pipelines.queue', queue.__all__)):\n"
        "    found = importlib.import_module(module)\n"
        "    wrong += [f'{module}.{name}' for name in names\n"
        "              if getattr(found, name, None) is not getattr(surface, name)]\n"
        "print(wrong)")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
    assert set(rota.pipelines.queue.__all__) <= set(rota.pipelines.__all__)
    assert all(callable(getattr(rota.pipelines, name)) for name in rota.pipelines.__all__)


def test_a_worker_runs_a_handler_registered_through_each_documented_name(database_url, tmp_path):
    engine = make_engine(database_url)
    for n, name in enumerate(NAMES):
        (tmp_path / f"via_{n}.py").write_text(
            f"from {name} import handler\n\n\n"
            f"@handler('via-{n}')\n"
            "def work(run, engine):\n"
            f"    assert run.payload == {{'through': {name!r}}}\n")
        register_job(engine, f"via-{n}")
        assert produce(engine, "surface", f"via/{n}", f"via-{n}", {"through": name}) == "created"
    env = {**os.environ, "ROTA_DATABASE_URL": database_url, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(ROOT)))}
    worker = subprocess.Popen([str(Path(sys.executable).parent / "rota"), "worker", "--poll", "0.05",
                               "--handlers", ",".join(f"via_{n}" for n in range(len(NAMES)))],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: worker.poll() is not None or not runs(engine, "state = 'queued' AND last_error IS NULL"), 60,
                 "every run to be tried")
    finally:
        code, output = stop(worker)
    assert code == 0, output
    assert runs(engine, "state <> 'succeeded'") == [], output
    assert len(runs(engine, "state = 'succeeded'")) == len(NAMES)
    engine.dispose()
