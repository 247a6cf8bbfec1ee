"""What README.md, CHANGELOG.md and docs/ name exists (no database): every path, every test
a claim names, every link, every environment variable, every `rota` command and flag, every
import; every block says how it is tested. tests/system/test_documents_run.py runs the
blocks themselves."""

import ast
import json
import re
import subprocess
import sys
from functools import cache

import pytest
import yaml

from tests.documents import DOCUMENTS, LANGUAGES, ROOT, blocks, code, code_spans, links, prose

# A repository path a reader may be pointed to, with the test or function it names after `::`.
_PATH = re.compile(r"(?<![\w./-])((?:pipelines|resources|schedules|sql|tests|deploy|docs|benchmarks|\.ci)"
                   r"/[\w./-]*\w)(?:::(\w+))?")
_VARIABLE = re.compile(r"\bROTA_[A-Z0-9_]*[A-Z0-9]\b")
_ROTA = re.compile(r"(?:^|(?<=[\s;&|(])|(?<=bin/))rota((?: +[^\s;&|)]+)*)")
_BENCHMARKS = re.compile(r"python -m benchmarks((?: +[^\s;&|)]+)*)")
_DOTTED = re.compile(r"(?:rota\.)?(?:pipelines|resources|schedules)(?:\.\w+)+")


def _named_paths(text: str):
    for match in _PATH.finditer(text):
        yield match.group(1).rstrip("."), match.group(2)


def _defines(path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name
               for node in ast.walk(tree))


def _missing(path: str, name: str | None) -> str | None:
    where = ROOT / path
    if not where.exists():
        return f"{path} does not exist"
    if name and not (where.suffix == ".py" and _defines(where, name)):
        return f"{path} defines no {name}"
    return None


def test_every_block_says_its_language_and_how_it_is_tested():
    wrong = []
    for document in DOCUMENTS:
        for block in blocks(document):
            if block.language not in LANGUAGES:
                wrong.append(f"{block}: a fence's language is one of {sorted(LANGUAGES)}")
            elif "tested-by" in block.info and not block.tested_by:
                wrong.append(f"{block}: tested-by names no test")
            for test in block.tested_by:
                path, _, name = test.partition("::")
                if not name or not path.startswith("tests/"):
                    wrong.append(f"{block}: tested-by {test} is not tests/…py::test_name")
                elif problem := _missing(path, name):
                    wrong.append(f"{block}: tested-by {problem}")
    assert wrong == []


def test_every_path_and_test_named_exists():
    wrong = [f"{where}: {problem}"
             for document in DOCUMENTS for where, text in code(document)
             for path, name in _named_paths(text) if (problem := _missing(path, name))]
    assert wrong == []


def _anchors(document) -> set[str]:
    """The anchors GitHub gives a document's headings."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", prose(document), re.M)}


def test_every_link_leads_somewhere():
    wrong = []
    for document in DOCUMENTS:
        for line, target in links(document):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = document.parent / path if path else document
            if not linked.exists():
                wrong.append(f"{document.relative_to(ROOT)}:{line}: {target} does not exist")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                wrong.append(f"{document.relative_to(ROOT)}:{line}: {linked.name} has no heading #{anchor}")
    assert wrong == []


def test_every_fence_is_one_the_tests_read():
    """A fence the parser does not see (indented in a list, ~~~) would be neither run nor
    checked."""
    wrong = []
    for document in DOCUMENTS:
        seen = set()
        for block in blocks(document):
            seen.update({block.line, block.line + block.text.count("\n") + 1})
        for number, line in enumerate(document.read_text().splitlines(), 1):
            if re.match(r"\s*(```|~~~)", line) and number not in seen:
                wrong.append(f"{document.relative_to(ROOT)}:{number}: {line.strip()}")
    assert wrong == []


def _code_text() -> str:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    texts = []
    for name in files:
        path = ROOT / name
        if path.suffix != ".md" and path.is_file():
            try:
                texts.append(path.read_text())
            except UnicodeDecodeError:
                continue
    return "\n".join(texts)


def test_every_environment_variable_named_is_one_the_code_reads():
    read = set(_VARIABLE.findall(_code_text()))
    wrong = sorted({f"{document.relative_to(ROOT)}: {name}" for document in DOCUMENTS
                    for name in _VARIABLE.findall(document.read_text()) if name not in read})
    assert wrong == []


@cache
def _help(*command: str) -> str:
    done = subprocess.run([*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _flags(arguments: str) -> list[str]:
    return [token.split("=")[0] for token in arguments.split() if token.startswith("--")]


def _rota_wrong(where: str, arguments: str) -> list[str]:
    rota = str(ROOT / ".venv" / "bin" / "rota") if (ROOT / ".venv" / "bin" / "rota").exists() else "rota"
    words = arguments.split()
    commands = re.findall(r"^ {4}([a-z][a-z-]+)", _help(rota), re.M)
    if not words or words[0].startswith("-"):
        return [f"{where}: rota has no {flag}" for flag in _flags(arguments) if flag not in _help(rota)]
    command = words[0]
    if command.startswith("<"):  # `rota <command> --help`: every command has --help
        return []
    if command not in commands:
        return [f"{where}: rota has no command {command!r}"]
    if command == "psql":  # what follows goes to psql
        return []
    listed = _help(rota, command)
    return [f"{where}: rota {command} has no {flag}" for flag in _flags(arguments)
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", listed)]


def test_every_rota_command_and_flag_named_is_one_the_cli_has():
    wrong = []
    for document in DOCUMENTS:
        pieces = [(f"{document.relative_to(ROOT)}:{line}", span) for line, span in code_spans(document)]
        pieces += [(str(block), line) for block in blocks(document) if block.language == "sh"
                   for line in block.text.splitlines()]
        for where, text in pieces:
            for arguments in _ROTA.findall(text):
                wrong += _rota_wrong(where, arguments)
            for arguments in _BENCHMARKS.findall(text):
                listed = _help(sys.executable, "-m", "benchmarks")
                wrong += [f"{where}: python -m benchmarks has no {flag}" for flag in _flags(arguments)
                          if flag not in listed]
    assert wrong == []


def test_every_python_block_compiles_and_every_yaml_block_parses():
    wrong = []
    for document in DOCUMENTS:
        for block in blocks(document):
            try:
                if block.language == "python":
                    ast.parse(block.text)
                elif block.language == "yaml":
                    yaml.safe_load(block.text)
            except (SyntaxError, yaml.YAMLError) as error:
                wrong.append(f"{block}: {error}")
    assert wrong == []


def _imports() -> list[dict]:
    """(where, module, names, text) of every import a document shows, and every dotted name."""
    found = []
    for document in DOCUMENTS:
        pieces = [(f"{document.relative_to(ROOT)}:{line}", span) for line, span in code_spans(document)
                  if span.startswith(("from ", "import "))]
        pieces += [(str(block), block.text) for block in blocks(document) if block.language == "python"]
        for where, text in pieces:
            try:
                tree = ast.parse(text)
            except SyntaxError:  # an elided import (`from rota.pipelines import …`); blocks are parsed above
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    found.append({"where": where, "module": node.module, "names": [a.name for a in node.names],
                                  "text": text})
                elif isinstance(node, ast.Import):
                    found += [{"where": where, "module": a.name, "names": [], "text": text} for a in node.names]
        found += [{"where": f"{document.relative_to(ROOT)}:{line}", "dotted": span}
                  for line, span in code_spans(document) if _DOTTED.fullmatch(span)]
    return found


_RESOLVE = """
import importlib, inspect, json, sys
wrong = []
for item in json.loads(sys.stdin.read()):
    where = item["where"]
    if "dotted" in item:
        parts = item["dotted"].split(".")
        for cut in range(len(parts), 0, -1):
            try:
                target = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        else:
            wrong.append(f"{where}: {item['dotted']} does not import")
            continue
        for part in parts[cut:]:
            if not hasattr(target, part):
                wrong.append(f"{where}: {item['dotted']}: no {part}")
                break
            target = getattr(target, part)
        continue
    if item["module"].split(".")[0] not in ("rota", "pipelines", "resources", "schedules"):
        continue  # the standard library's and Dagster's names are theirs to keep
    try:
        module = importlib.import_module(item["module"])
    except ImportError as error:
        wrong.append(f"{where}: {error}")
        continue
    for name in item["names"]:
        value = getattr(module, name, None)
        if value is None:
            wrong.append(f"{where}: {item['module']} has no {name}")
        elif inspect.ismodule(value) and f"{name}(" in item["text"]:
            wrong.append(f"{where}: {item['module']}.{name} is a module, called as a function")
print(json.dumps(wrong))
"""


def test_every_import_and_dotted_name_shown_resolves():
    """From a checkout (SPEC's names) and as installed (rota.…), each name is what the
    document says it is: a module named where a function is called is wrong."""
    done = subprocess.run([sys.executable, "-c", _RESOLVE], cwd=ROOT, input=json.dumps(_imports()),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


@pytest.mark.parametrize("broken, expected", [
    ("`pipelines/handlers.py`", "pipelines/handlers.py does not exist"),
    ("`tests/unit/test_documents.py::test_nothing`", "defines no test_nothing"),
])
def test_a_wrong_path_is_named(broken, expected):
    problems = [_missing(path, name) for path, name in _named_paths(broken)]
    assert any(expected in (problem or "") for problem in problems)
