"""The project's promises about itself: the README's commands and the test environment."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    return re.findall(r"```sh[^\n]*\n(.+?)\n```", (ROOT / "README.md").read_text())[:2]


def test_the_readme_opens_with_the_start_and_test_commands():
    start, tests = readme_commands()
    assert start.endswith("rota dev") and tests.endswith("pytest")


def test_ci_runs_the_readme_test_command_and_nothing_else():
    """Beside the test command, .ci/run may only install a missing system package."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith("#") and line not in ("set -euo pipefail", 'cd "$(dirname "$0")/.."')
          and not line.startswith("#!")]
    installs = [line for line in ci if re.fullmatch(r"command -v (\S+) >/dev/null \|\| \{ apt-get update -qq && "
                                                    r"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \S+ "
                                                    r">/dev/null; \}", line)]
    assert [line for line in ci if line not in installs] == [readme_commands()[1]]


def test_the_suite_runs_outside_utc(engine):
    """Time-zone bugs are invisible in UTC; the suite defaults to zones far from it."""
    with engine.connect() as conn:
        session_zone = conn.execute(text("SHOW TimeZone")).scalar_one()
    assert session_zone == os.environ["PGTZ"]
    if "ROTA_TEST_ALLOW_UTC" not in os.environ:
        assert session_zone not in ("UTC", "Etc/UTC") and time.timezone != 0


def _fresh_interpreter(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_producers_and_the_worker_load_without_dagster():
    """Importing Dagster costs 1.2 s and 165k objects, whose first full garbage collection
    every racing producer process then pays (issue 5, enqueue_race)."""
    done = _fresh_interpreter(
        "import sys\n"
        "import rota.pipelines.queue.enqueue, rota.pipelines.queue.producing, rota.pipelines.queue.worker, "
        "rota.pipelines.dispatch.run, rota.pipelines.cli.main\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster')[:3])"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_definitions_load_without_a_warning():
    done = _fresh_interpreter("import pipelines.definitions")  # as workspace.yaml names them
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr


def test_a_checkout_answers_to_the_specs_names_with_the_installed_packages_objects():
    """SPEC's interface names (`pipelines.queue`, `pipelines.definitions`) work from a
    checkout, as the folders of the repository; what they hand out is the installed
    `rota.pipelines` code itself, not a second copy with classes of its own."""
    done = _fresh_interpreter(
        "from pipelines.queue import AlreadyQueued, Enqueued, enqueue_scheduled\n"
        "import rota.pipelines.queue.enqueue as installed\n"
        "import pipelines.definitions as checkout, rota.pipelines.definitions as package\n"
        "same = [a is b for a, b in zip(checkout.defs.assets, package.defs.assets, strict=True)]\n"
        "print(enqueue_scheduled is installed.enqueue_scheduled, Enqueued is installed.Enqueued,\n"
        "      AlreadyQueued is installed.AlreadyQueued, all(same) and len(same) > 5)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"] * 4


def test_the_unit_tier_runs_with_no_database_reachable(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROTA_", "PG"))}
    env.update(ROTA_DATABASE_URL="postgresql://nobody@127.0.0.1:9/none", ROTA_HOME=str(tmp_path),
               ROTA_HISTORY_START="2026-01-01")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout
