"""The named queries (no database): every queries.sql parses, and every query in one is
used by the code beside it, so a statement cannot outlive the code that ran it."""

import re
from pathlib import Path

import pytest

from rota.resources.database.queries import QUERIES_FILE, parse, queries

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(path for top in ("pipelines", "resources", "schedules") for path in (ROOT / top).rglob(QUERIES_FILE))


def package_of(path: Path) -> str:
    return ".".join(("rota", *path.parent.relative_to(ROOT).parts))


def test_every_domain_with_sql_keeps_it_in_one_file():
    assert {package_of(path) for path in FILES} == {
        "rota.pipelines.dispatch", "rota.pipelines.periods", "rota.pipelines.queue", "rota.pipelines.sources",
        "rota.resources.database", "rota.schedules"}


@pytest.mark.parametrize("path", FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_query_is_run_by_the_code_beside_it(path):
    code = "\n".join(module.read_text() for module in path.parent.glob("*.py"))
    unused = [name for name in queries(package_of(path)) if not re.search(rf"""QUERIES\["{name}"\]""", code)]
    assert unused == []


@pytest.mark.parametrize("text, problem", [
    ("SELECT 1;\n-- name: one\nSELECT 1;", "SQL before the first"),
    ("-- name: one\nSELECT 1;\n-- name: one\nSELECT 2;", "named twice"),
    ("-- name: one\n-- only a comment\n", "has no statement"),
    ("-- name: one\nSELECT 1; SELECT 2;", "more than one statement"),
    ("-- name: One\nSELECT 1;", "is not a query name"),
    ("-- name: one\n/* fragment: two */;", "no fragment two"),
    ("-- fragment: two\nSELECT 2;\n-- name: one\nSELECT 1;", "the fragment two is used by no query"),
    ("-- fragment: two\nSELECT 2;\n-- fragment: two\nSELECT 3;\n-- name: one\n/* fragment: two */;", "named twice"),
])
def test_a_malformed_file_is_refused_naming_the_query(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse(text, "x/queries.sql")


def test_comments_are_the_readers_and_never_reach_the_server():
    parsed = parse("-- a file's preamble\n-- name: one\n-- why: 100%% sure\nSELECT :a\n  -- inline\nFROM t;\n", "x")
    assert dict(parsed) == {"one": "SELECT :a\nFROM t"}


def test_a_fragment_is_spliced_where_a_query_names_it_indented_as_that_line():
    parsed = parse("-- name: one\nWITH a AS (\n    /* fragment: rows */ SKIP LOCKED\n)\nTABLE a;\n"
                   "-- fragment: rows\n-- why the rows are shaped so\nSELECT x\nFROM t\n    WHERE y\nFOR SHARE;\n", "x")
    assert dict(parsed) == {"one": "WITH a AS (\n    SELECT x\n    FROM t\n        WHERE y\n    FOR SHARE SKIP LOCKED\n)\nTABLE a"}
