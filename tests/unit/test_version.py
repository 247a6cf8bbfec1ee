"""`rota --version` prints the installed distribution's version, the one CHANGELOG.md's
releases are named by."""

import re
from importlib.metadata import version
from pathlib import Path

import pytest

from rota.pipelines.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_rota_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"rota {version('rota')}"


def test_the_changelog_names_the_current_version():
    current = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert current == version("rota")
    assert f"## {current}" in (ROOT / "CHANGELOG.md").read_text()
