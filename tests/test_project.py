"""The project's promises about itself: the README's commands and the test environment."""

import os
import re
import time
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())[:2]


def test_the_readme_opens_with_the_start_and_test_commands():
    start, tests = readme_commands()
    assert start.endswith("rota dev") and tests.endswith("pytest")


def test_ci_runs_the_readme_test_command_and_nothing_else():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith("#") and line not in ("set -euo pipefail", 'cd "$(dirname "$0")/.."')
          and not line.startswith("#!")]
    assert ci == [readme_commands()[1]]


def test_the_suite_runs_outside_utc(engine):
    """Time-zone bugs are invisible in UTC; the suite defaults to zones far from it."""
    with engine.connect() as conn:
        session_zone = conn.execute(text("SHOW TimeZone")).scalar_one()
    assert session_zone == os.environ["PGTZ"]
    if "ROTA_TEST_ALLOW_UTC" not in os.environ:
        assert session_zone not in ("UTC", "Etc/UTC") and time.timezone != 0
