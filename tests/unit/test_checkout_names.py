"""Every module answers to its checkout name and its installed name with one module object
(issue 36): a registry, a cache or a class never exists twice."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"pipelines": "rota.pipelines", "resources": "rota.resources", "schedules": "rota.schedules"}


def _module_names() -> list[tuple[str, str]]:
    names = []
    for folder, installed in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts[-1:] == ("__main__",):
                continue
            names.append((".".join((folder, *parts)), ".".join((installed, *parts))))
    return names


def _printed(code: str) -> list[str]:
    """The words `code` prints in a fresh interpreter, which must exit cleanly."""
    env = {**os.environ, "ROTA_HISTORY_START": "2026-01-01"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_every_module_is_one_object_by_either_name():
    names = _module_names()
    assert len(names) > 40
    # The checkout names first, as workspace.yaml and SPEC's examples import them.
    assert _printed(
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "checkout = {c: importlib.import_module(c) for c, _ in names}\n"
        "apart = [c for c, i in names if checkout[c] is not importlib.import_module(i)]\n"
        "print(apart)\n"
    ) == ["[]"]


def test_a_handler_registered_by_the_checkout_name_is_the_workers():
    assert _printed(
        "from pipelines.queue.handlers import handler\n"
        "from rota.pipelines.queue import handlers as workers\n"
        "import pipelines.queue.claims as checkout, rota.pipelines.queue.claims as installed\n"
        "@handler('from_the_checkout')\n"
        "def work(run, engine):\n"
        "    pass\n"
        "print('from_the_checkout' in workers.HANDLERS, checkout.ClaimedRun is installed.ClaimedRun)\n"
    ) == ["True", "True"]


def test_the_installed_modules_keep_their_own_specs():
    """A module handed out under its checkout name still finds its files (queries.sql)."""
    assert _printed(
        "import pipelines.dispatch.writing\n"
        "import rota.pipelines.dispatch as dispatch\n"
        "from rota.resources.database.queries import queries\n"
        "print(dispatch.__spec__.name, 'insert_new' in queries('rota.pipelines.dispatch'))\n"
    ) == ["rota.pipelines.dispatch", "True"]
