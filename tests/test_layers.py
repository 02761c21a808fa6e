"""The import-linter contracts (pyproject.toml) hold, and they catch an import that breaks them.

The planted runs lint a copy of the source tree, so the checkout is never touched: the copy is laid
out as `fastpath/<layer>/`, and Python runs with -S so that the editable install's import hook does
not redirect `fastpath` back to the checkout.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("vocab", "schema", "compiler", "runtime", "serve")
LINT = "import sys\nfrom importlinter.cli import lint_imports\nsys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))\n"


def _lint(tmp_path: Path, plant: dict[str, str]) -> subprocess.CompletedProcess:
    tree = tmp_path / "src"
    for layer in LAYERS:
        shutil.copytree(
            REPO / layer, tree / "fastpath" / layer, ignore=shutil.ignore_patterns("__pycache__", "*.so")
        )
    for rel, text in plant.items():
        (tree / "fastpath" / rel).write_text(text)
    config = tmp_path / "pyproject.toml"
    shutil.copy(REPO / "pyproject.toml", config)
    path = [str(tree), *site.getsitepackages()]
    return subprocess.run(
        [sys.executable, "-S", "-c", LINT, str(config)],
        env={"PYTHONPATH": ":".join(path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_contracts_hold(tmp_path):
    done = _lint(tmp_path, {})
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("planted", "contract"),
    [
        ({"runtime/planted.py": "import fastpath.compiler\n"}, "the runtime knows nothing of manifests"),
        (
            {"runtime/model/planted.py": "from fastpath.schema import loader\n"},
            "the runtime knows nothing of manifests",
        ),
        ({"schema/planted.py": "import fastpath.runtime\n"}, "the schema is pure data"),
        ({"vocab/planted.py": "import fastpath.schema\n"}, "the vocabulary depends on no other layer"),
        (
            {"compiler/planted.py": "import fastpath.runtime.engine\n"},
            "the compiler reaches the runtime only",
        ),
        ({"runtime/model/planted.py": "from ..engine import llm\n"}, "runtime folders point one way"),
        (
            {"runtime/kernels/planted.py": "from ..attention import library\n"},
            "runtime folders point one way",
        ),
    ],
    ids=[
        "runtime->compiler",
        "runtime->schema",
        "schema->runtime",
        "vocab->schema",
        "compiler->runtime",
        "model->engine",
        "kernels->attention",
    ],
)
def test_a_planted_import_breaks_its_contract(tmp_path, planted, contract):
    done = _lint(tmp_path, planted)
    assert done.returncode == 1, done.stdout + done.stderr
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN") or "BROKEN (" in line]
    assert any(line.startswith(contract) for line in broken), done.stdout
