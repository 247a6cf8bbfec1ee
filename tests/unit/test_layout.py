"""The code's rooms and the doors between them (no database): each domain imports only the
rooms beneath it, so a behaviour is found in one folder and changed without reaching up.

resources (the database and Dagster resources) < pipelines' domains (periods < dispatch;
periods < queue < sources) < schedules < pipelines/definitions.py < the cli. Nothing
imports benchmarks or tests."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = ("periods", "dispatch", "queue", "sources")
BELOW = {
    "resources": set(),
    # pipelines/__init__.py alone: it answers to its checkout name (resources/checkout_names.py)
    # and re-exports the public surface, which is the queue's.
    "pipelines": {"resources", "queue"},
    "periods": {"resources"},
    "dispatch": {"resources", "periods"},
    "queue": {"resources", "periods"},
    "sources": {"resources", "periods", "queue"},
    "schedules": {"resources", *DOMAINS},
    "definitions": {"resources", *DOMAINS, "schedules"},
    "cli": {"resources", *DOMAINS, "schedules", "definitions"},
}
MAX_LINES = 400


def room(module: str) -> str | None:
    """The room a dotted module name lives in (None: not rota's application code)."""
    parts = module.split(".")
    if parts[0] == "rota":
        parts = parts[1:]
    if parts[0] == "resources" or parts[0] == "schedules":
        return parts[0]
    if parts[0] == "pipelines" and len(parts) > 1:
        return parts[1] if parts[1] in (*DOMAINS, "definitions", "cli") else "pipelines"
    if parts[0] in ("benchmarks", "tests"):
        return parts[0]
    return None


def application_modules():
    for top in ("pipelines", "resources", "schedules"):
        for path in sorted((ROOT / top).rglob("*.py")):
            yield ".".join(("rota", *path.relative_to(ROOT).with_suffix("").parts)), path


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def doors(modules) -> list[tuple[str, str]]:
    """Every import of one room from another that the layering does not allow."""
    wrong = []
    for module, path in modules:
        here = room(module)
        for imported in imports_of(path):
            there = room(imported)
            if there is None or there == here:
                continue
            if there not in BELOW.get(here, set()):
                wrong.append((module, imported))
    return wrong


def test_no_import_runs_back_up_a_layer_or_into_benchmarks_or_tests():
    assert doors(application_modules()) == []


def test_the_rule_sees_an_import_that_runs_back_up(tmp_path):
    # Held to one module that reaches up, as resources/postgres.py once did.
    reaching = tmp_path / "postgres.py"
    reaching.write_text("def writers():\n    from rota.pipelines.dispatch.run import DEFAULT_PAGE_SIZE\n")
    assert doors([("rota.resources.postgres", reaching)]) == [("rota.resources.postgres", "rota.pipelines.dispatch.run")]
    assert room("rota.pipelines.queue.worker") == "queue" and room("rota.pipelines.cli.main") == "cli"


def test_the_code_imports_itself_by_its_installed_name():
    """Installed, the code is rota.pipelines, rota.resources and rota.schedules; the bare
    folder names exist only in a checkout, so an import of one would fail in a wheel."""
    bare = [(module, imported) for module, path in application_modules() for imported in imports_of(path)
            if imported.split(".")[0] in ("pipelines", "resources", "schedules")]
    assert bare == []


@pytest.mark.parametrize("module,path", list(application_modules()), ids=lambda v: str(v))
def test_no_module_is_over_the_size_a_reader_takes_in_at_once(module, path):
    assert len(path.read_text().splitlines()) <= MAX_LINES, f"{module} has grown past {MAX_LINES} lines: split it"


def migrations():
    for path in sorted((ROOT / "sql").rglob("*.py")):
        yield ".".join(("rota_sql", *path.relative_to(ROOT / "sql").with_suffix("").parts)), path


def test_the_migrations_are_frozen_they_import_no_rota_code():
    """A migration replays the same way forever: an import of rota's code (a helper, another
    migration) would change an old migration whenever that code changes."""
    reaching = {(module, imported) for module, path in migrations() for imported in imports_of(path)
                if room(imported) is not None or imported.startswith("rota_sql") or imported == "importlib"}
    assert reaching == set()
