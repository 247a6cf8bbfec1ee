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
from rota.pipelines import make_engine, produce, register_job
from tests.queue.test_queue import runs, stop, wait_for

ROOT = Path(__file__).resolve().parents[2]
# Installed (any directory) and from a checkout (SPEC's and workspace.yaml's names).
NAMES = ["rota.pipelines", "rota.pipelines.queue", "rota.pipelines.queue.handlers",
         "pipelines", "pipelines.queue", "pipelines.queue.handlers"]


def test_the_surface_is_one_object_per_name():
    done = subprocess.run([sys.executable, "-c", (
        "import importlib, rota.pipelines as surface\n"
        f"names = {NAMES!r}\n"
        "apart = [f'{n}.{a}' for n in names for a in surface.__all__\n"
        "         if hasattr(importlib.import_module(n), a) and getattr(importlib.import_module(n), a) is not "
        "getattr(surface, a)]\n"
        "print(apart, sorted(surface.__all__))")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    apart, exported = done.stdout.split("] ", 1)
    assert apart == "["
    assert exported.strip() == str(sorted(rota.pipelines.__all__))
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
