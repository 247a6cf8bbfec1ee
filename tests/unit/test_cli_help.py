"""`rota <command> --help` states each option's real default and never a stored one that
reads as the opposite (issue 39: `--no-listen … (default: True)`); a handler module that is
not there is refused by name before a database is needed."""

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


def test_a_worker_refuses_a_handler_module_it_cannot_find_by_name(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "ROTA_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    done = subprocess.run([sys.executable, "-m", "rota.pipelines.cli", "worker", "--handlers", "myapp.handlers"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "refused to start: no module 'myapp.handlers'" in done.stdout, done.stdout + done.stderr
