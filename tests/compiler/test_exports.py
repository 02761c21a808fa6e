"""fastpath.compiler's functions stay functions whatever was imported before them."""

import subprocess
import sys

ORDERS = [
    "from fastpath.compiler import native_llm",  # native.py imports .resolve and .render first
    "import fastpath.compiler.resolve, fastpath.compiler.render",
    "from fastpath.compiler.render import lock_json",
]


def test_resolve_and_render_are_the_functions_after_their_submodules_load():
    for first in ORDERS:
        code = (
            f"{first}\nfrom fastpath.compiler import render, resolve\n"
            "import types\nassert not isinstance(resolve, types.ModuleType), resolve\n"
            "assert not isinstance(render, types.ModuleType), render\nassert callable(resolve) and callable(render)"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"after {first!r}: {done.stderr}"
