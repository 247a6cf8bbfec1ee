"""rota uses Dagster's public API only (SPEC §6): no module of the product imports a private
Dagster module (`dagster._…`, or one of a `dagster_*` package), nor names one as a string
(`python -m dagster._daemon`, `importlib.import_module(...)`): Dagster changes those
between releases without notice, and the pins are a range (pyproject.toml)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

from rota.pipelines.cli.dev import DAEMON
from rota.pipelines.periods.partitions import PARTITION_RANGE_END_TAG, PARTITION_RANGE_START_TAG

ROOT = Path(__file__).resolve().parents[2]
# A dotted name in a Dagster distribution with a segment Dagster marks private.
PRIVATE = re.compile(r"dagster\w*(\.\w+)*\._\w*(\.\w+)*")


def product_files():
    """Every Python file of the product: all of the repository but tests/, build output and
    hidden folders (virtualenvs, .rota/, .git)."""
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if parts[0] in ("tests", "build", "dist") or any(p.startswith(".") or p.endswith(".egg-info") for p in parts):
            continue
        yield path


def _private(name: str | None) -> bool:
    return name is not None and PRIVATE.fullmatch(name) is not None


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each import of a private Dagster module and each string naming one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [a.name for a in node.names]
            if _private(node.module) or any(_private(f"{node.module}.{n}") for n in names):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value):
            found.append((node.lineno, repr(node.value)))
    return found


def test_no_module_of_the_product_uses_a_private_dagster_module():
    files = list(product_files())
    assert ROOT / "pipelines" / "cli" / "dev.py" in files and ROOT / "benchmarks" / "bench.py" in files
    uses = [f"{path.relative_to(ROOT)}:{line}: {what}"
            for path in files for line, what in private_uses(path.read_text())]
    assert uses == [], "private Dagster API used:\n" + "\n".join(uses)


def test_the_rule_sees_each_way_of_reaching_a_private_module():
    source = "\n".join((
        "import dagster._core.storage.tags",
        "from dagster._grpc.client import DagsterGrpcClient",
        "from dagster import _check",
        "from dagster_postgres._x import y",
        "command = ['python', '-m', 'dagster._daemon', 'run']",
        # Public: what rota does use, and prose that merely mentions the rule.
        "from dagster import AssetCheckEvaluation",
        "import dagster_postgres",
        "command = ['python', '-m', 'dagster', 'api', 'grpc-health-check']",
        "'''rota never imports dagster._ modules.'''",
        "config = {'module': 'dagster.core.run_coordinator'}",
    ))
    assert [line for line, _ in private_uses(source)] == [1, 2, 3, 4, 5]


def test_the_range_tags_rota_spells_out_are_the_ones_dagster_reads():
    # Dagster exports no public name for them; a test may read the private one, and fails
    # here, not in every scheduled run, the day Dagster renames them.
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    assert (PARTITION_RANGE_START_TAG, PARTITION_RANGE_END_TAG) == (ASSET_PARTITION_RANGE_START_TAG,
                                                                    ASSET_PARTITION_RANGE_END_TAG)


def test_rota_dev_starts_dagsters_daemon_and_asks_its_health_check_by_their_public_commands():
    daemon = subprocess.run([sys.executable, "-c", DAEMON, "run", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert daemon.returncode == 0 and daemon.stdout.startswith("Usage: dagster-daemon run"), daemon.stderr
    check = subprocess.run([sys.executable, "-m", "dagster", "api", "grpc-health-check", "--help"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and "--port" in check.stdout, check.stderr
