"""The code README.md and docs/ show, run as written against a fresh database: each
document's blocks in order, in a directory of their own (a reader's project), with rota
installed and ROTA_DATABASE_URL set; `rota worker` runs until the runs the document made are
done, and every one of them must have succeeded. tests/unit/test_documents.py checks what
the prose names; tests/documents.py says how a block says how it is tested."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.documents import DOCUMENTS, ROOT, blocks
from tests.helpers import tenant

RUNNABLE = [document for document in DOCUMENTS if any(block.runs for block in blocks(document))]
BIN = Path(sys.executable).parent


def _environment(database_url: str, home: Path) -> dict:
    """A reader's shell in their project: no PYTHONPATH (the project is the current
    directory, as README's `rota worker --handlers myapp.handlers` is run)."""
    environment = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "ROTA_HOME")}
    return {**environment, "ROTA_DATABASE_URL": database_url, "ROTA_HOME": str(home / ".rota"),
            "PATH": f"{BIN}{os.pathsep}{environment['PATH']}"}


# A run the document made that is owed now: due, or already tried (a failed attempt waits
# out its backoff in the future, and must not pass for a run not yet due).
_OWED = "(run_at <= now() OR attempts > 0)"


def _unfinished(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        return conn.execute(f"SELECT count(*) FROM job_queue WHERE {_OWED} AND (state IN ('queued', 'running') "
                            "AND last_error IS NULL)").fetchone()[0]


def _work_until_done(block, command: str, cwd: Path, environment: dict, database_url: str) -> None:
    worker = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=environment,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while _unfinished(database_url) and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, f"{block}: `{command}` exited {worker.returncode}\n{output[-3000:]}"
    assert not _unfinished(database_url), f"{block}: runs left unfinished after 60 s\n{output[-3000:]}"


def _printed(text: str) -> list[str]:
    """What a block says it prints: `print(…)  # created` prints `created`."""
    return [line.rsplit("# ", 1)[1].strip() for line in text.splitlines()
            if line.startswith("print(") and "  # " in line]


def _run(block, cwd: Path, environment: dict, database_url: str) -> None:
    if block.language == "python":
        done = subprocess.run([sys.executable, "-c", block.text], cwd=cwd, env=environment, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{block} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        if said := _printed(block.text):
            assert done.stdout.splitlines() == said, f"{block} printed something else"
    elif block.language == "sh":
        command = block.text.strip()
        if command.startswith("rota worker") and "\n" not in command:
            _work_until_done(block, command, cwd, environment, database_url)
            return
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=cwd, env=environment,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{block} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    elif block.language == "sql":
        with (tenant(database_url, None) if "tenant" in block.info
              else psycopg.connect(database_url, autocommit=True)) as conn:
            try:
                conn.execute(block.text)
            except psycopg.Error as error:
                pytest.fail(f"{block} failed: {error}")


def test_the_documents_that_teach_by_example_are_run():
    """A document whose every block came to say `tested-by`, or to be a file, would drop
    out of the run below without a word."""
    assert {ROOT / "README.md", ROOT / "docs" / "integrating.md", ROOT / "docs" / "operating.md"} <= set(RUNNABLE)


@pytest.mark.parametrize("document", RUNNABLE, ids=[str(d.relative_to(ROOT)) for d in RUNNABLE])
def test_the_documents_code_runs_as_written(document, database_url, tmp_path):
    environment = _environment(database_url, tmp_path)
    for block in blocks(document):
        if block.file:
            path = tmp_path / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text)
            (path.parent / "__init__.py").touch()
        elif block.runs:
            _run(block, tmp_path, environment, database_url)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        failed = conn.execute(f"SELECT id, state, last_error FROM job_queue WHERE {_OWED} "
                              "AND state <> 'succeeded' ORDER BY id").fetchall()
    assert failed == [], f"{document.name}: runs that did not succeed"
