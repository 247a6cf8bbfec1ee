"""rota as an installed package: the wheel carries its migrations, and from an empty
directory `rota migrate` and Dagster's own validation of the definitions work."""

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """The wheel built from this checkout, installed without the editable link into a fresh
    virtualenv that borrows only the third-party packages of the test environment."""
    work = tmp_path_factory.mktemp("package")
    # From a clean copy: an egg-info left by the editable install would add its files.
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".rota", ".git", "*.egg-info", "build", "dist", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(work / "dist"), str(source)], check=True, capture_output=True, text=True)
    [wheel] = (work / "dist").glob("rota-*.whl")
    venv.create(work / "venv", with_pip=False)
    python = work / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # A .pth line adds the test environment's packages; its own .pth files (the editable
    # link to this checkout among them) are not processed from there.
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(wheel)],
                   check=True, capture_output=True, text=True)
    return work, python, wheel


def test_the_wheel_carries_the_migrations_and_the_schema(installed):
    import zipfile

    _, _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "rota_sql/env.py" in names and "rota_sql/script.py.mako" in names and "rota_sql/schema.sql" in names
    assert any(n.startswith("rota_sql/versions/0008_") for n in names)
    # Everything else under the name rota: no generic top-level package in site-packages.
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"rota", "rota_sql"}, tops
    assert "rota/pipelines/definitions.py" in names and "rota/resources/postgres.py" in names
    assert "rota/pipelines/dispatch/queries.sql" in names and "rota/resources/database/queries.sql" in names


def test_an_installed_rota_migrates_and_loads_from_an_empty_directory(installed, database_url, tmp_path):
    work, python, _ = installed
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"ROTA_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "DAGSTER_HOME": str(tmp_path)}
    where = subprocess.run([str(python), "-c", "import rota.pipelines, rota_sql; print(rota.pipelines.__file__, "
                            "rota_sql.__file__)"], cwd=empty, env=env, check=True, capture_output=True, text=True).stdout
    assert str(ROOT) not in where and str(work) in where  # the installed copy, not the checkout
    migrated = subprocess.run([str(python), "-m", "rota.pipelines.cli", "migrate"], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    validated = subprocess.run([str(python), "-m", "dagster", "definitions", "validate", "-m", "rota.pipelines.definitions"],
                               cwd=empty, env=env, capture_output=True, text=True, timeout=120)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert list(empty.iterdir()) == []  # nothing landed in the working directory either
