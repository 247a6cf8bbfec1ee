"""Named SQL queries, read once from the `queries.sql` beside the code that runs them.

A file is a sequence of queries, each under a header line `-- name: <name>`, with the
comment lines under the header saying why the statement is shaped as it is. Comment
lines are the reader's: they are dropped from the statement (a `:word` or a percent sign
in a comment would otherwise read as a parameter to SQLAlchemy or psycopg). A small
parser written here rather than a query library such as aiosql: rota runs its statements
through SQLAlchemy's `text()` and psycopg's own cursors, with binary parameters and
COPY, and needs from a file only the statements by name.

A piece of SQL that several statements share is written once, under a header line
`-- fragment: <name>`, and a statement takes it in with a line that begins (after its
indentation) with `/* fragment: <name> */`: the fragment stands there, each of its lines
indented as that line, so the server receives the statement as if it were written out
whole. A fragment is not a query; one that no query uses is refused, as is a use of one
the file does not have."""

import re
from functools import cache
from importlib.resources import files
from types import MappingProxyType
from typing import Mapping

QUERIES_FILE = "queries.sql"
_HEADER = re.compile(r"^-- (name|fragment): (\S+)[ \t]*$", re.M)
_USE = re.compile(r"^([ \t]*)/\* fragment: (\S+) \*/", re.M)
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def parse(text: str, where: str) -> Mapping[str, str]:
    """The queries of one file's text by name, fragments spliced in; `where` names the
    file in errors."""
    parts = _HEADER.split(text)
    preamble, named = parts[0], list(zip(parts[1::3], parts[2::3], parts[3::3]))
    if _statement(preamble):
        raise ValueError(f"{where}: SQL before the first '-- name:' header")
    pieces = {"query": {}, "fragment": {}}
    for header, name, body in named:
        kind = "query" if header == "name" else "fragment"
        if not _NAME.fullmatch(name):
            raise ValueError(f"{where}: {name!r} is not a {kind} name (lower case, digits, underscores)")
        if name in pieces[kind]:
            raise ValueError(f"{where}: the {kind} {name} is named twice")
        statement = _statement(body).removesuffix(";").rstrip()
        if not statement:
            raise ValueError(f"{where}: the {kind} {name} has no statement")
        if ";" in statement:
            raise ValueError(f"{where}: the {kind} {name} holds more than one statement")
        pieces[kind][name] = statement
    fragments, used = pieces["fragment"], set()

    def splice(use: re.Match) -> str:
        indent, fragment = use[1], use[2]
        if fragment not in fragments:
            raise ValueError(f"{where}: there is no fragment {fragment}")
        used.add(fragment)
        return indent + fragments[fragment].replace("\n", "\n" + indent)

    queries = {name: _USE.sub(splice, statement) for name, statement in pieces["query"].items()}
    if unused := sorted(fragments.keys() - used):
        raise ValueError(f"{where}: the fragment {unused[0]} is used by no query")
    return MappingProxyType(queries)


def _statement(body: str) -> str:
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--")).strip()


@cache
def queries(package: str) -> Mapping[str, str]:
    """The named queries of `package`'s queries.sql, read on first use."""
    return parse(files(package).joinpath(QUERIES_FILE).read_text(), f"{package.replace('.', '/')}/{QUERIES_FILE}")
