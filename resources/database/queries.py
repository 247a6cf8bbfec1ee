"""Named SQL queries, read once from the `queries.sql` beside the code that runs them.

A file is a sequence of queries, each under a header line `-- name: <name>`, with the
comment lines under the header saying why the statement is shaped as it is. Comment
lines are the reader's: they are dropped from the statement (a `:word` or a percent sign
in a comment would otherwise read as a parameter to SQLAlchemy or psycopg). A small
parser written here rather than a query library such as aiosql: rota runs its statements
through SQLAlchemy's `text()` and psycopg's own cursors, with binary parameters and
COPY, and needs from a file only the statements by name."""

import re
from functools import cache
from importlib.resources import files
from types import MappingProxyType
from typing import Mapping

QUERIES_FILE = "queries.sql"
_HEADER = re.compile(r"^-- name: (\S+)[ \t]*$", re.M)
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def parse(text: str, where: str) -> Mapping[str, str]:
    """The queries of one file's text by name; `where` names the file in errors."""
    parts = _HEADER.split(text)
    preamble, named = parts[0], list(zip(parts[1::2], parts[2::2]))
    if _statement(preamble):
        raise ValueError(f"{where}: SQL before the first '-- name:' header")
    queries = {}
    for name, body in named:
        if not _NAME.fullmatch(name):
            raise ValueError(f"{where}: {name!r} is not a query name (lower case, digits, underscores)")
        if name in queries:
            raise ValueError(f"{where}: the query {name} is named twice")
        statement = _statement(body).removesuffix(";").rstrip()
        if not statement:
            raise ValueError(f"{where}: the query {name} has no statement")
        if ";" in statement:
            raise ValueError(f"{where}: the query {name} holds more than one statement")
        queries[name] = statement
    return MappingProxyType(queries)


def _statement(body: str) -> str:
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--")).strip()


@cache
def queries(package: str) -> Mapping[str, str]:
    """The named queries of `package`'s queries.sql, read on first use."""
    return parse(files(package).joinpath(QUERIES_FILE).read_text(), f"{package.replace('.', '/')}/{QUERIES_FILE}")
