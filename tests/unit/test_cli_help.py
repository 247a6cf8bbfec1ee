"""`rota <command> --help` states each option's real default and never a stored one that
reads as the opposite (issue 39: `--no-listen … (default: True)`)."""

import re
import subprocess
import sys

import pytest

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
