"""README.md, CHANGELOG.md and docs/*.md as the documentation tests read them: fenced blocks
with their info strings, inline code, links.

A fence's info string is its language and how it is tested: ```python, ```sh and ```sql
blocks run (tests/system/test_documents_run.py) unless it says `tested-by` and names the
tests that do what the block does (`tested-by tests/system/test_x.py::test_y`); ```sql
tenant runs as the tenants' role; a ```python block whose first line is a comment naming a
file (`# myapp/handlers.py`) is that file, written for the blocks after it."""

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "sh", "sql"}
LANGUAGES = RUN | {"yaml", "text"}

_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FILE_COMMENT = re.compile(r"# ([\w./-]+\.py)\n")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    info: tuple[str, ...]
    text: str

    @property
    def language(self) -> str:
        return self.info[0] if self.info else ""

    @property
    def tested_by(self) -> list[str]:
        return list(self.info[self.info.index("tested-by") + 1:]) if "tested-by" in self.info else []

    @property
    def file(self) -> str | None:
        """The file a ```python block is (its first line names it), or None: a script."""
        named = _FILE_COMMENT.match(self.text) if self.language == "python" else None
        return named.group(1) if named else None

    @property
    def runs(self) -> bool:
        return self.language in RUN and not self.tested_by and self.file is None

    def __str__(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line} ({' '.join(self.info) or 'no language'})"


def blocks(document: Path) -> list[Block]:
    text = document.read_text()
    return [Block(document, text.count("\n", 0, match.start()) + 1, tuple(match.group(1).split()), match.group(2))
            for match in _FENCE.finditer(text)]


def prose(document: Path) -> str:
    """The document without its fenced blocks (each kept as as many empty lines)."""
    return _FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), document.read_text())


def code_spans(document: Path) -> list[tuple[int, str]]:
    """Inline code, by line, with a span wrapped over two lines joined by one space."""
    text = prose(document)
    return [(text.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split()))
            for match in _SPAN.finditer(text)]


def links(document: Path) -> list[tuple[int, str]]:
    text = prose(document)
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in _LINK.finditer(text)]


def code(document: Path) -> list[tuple[str, str]]:
    """Every piece of code a reader may copy: (where, text) for inline code and blocks."""
    name = document.relative_to(ROOT)
    return ([(f"{name}:{line}", span) for line, span in code_spans(document)]
            + [(str(block), block.text) for block in blocks(document)])
