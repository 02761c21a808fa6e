"""build: scikit-build-core builds a generated package (--no-build-isolation style), it imports in
place, and rebuilding it unchanged compiles nothing."""

import subprocess
import sys

import pytest
from compile_helpers import REPO

from fastpath.compiler import build_package, render, resolve, write_package
from fastpath.schema import load_manifest


@pytest.mark.slow
def test_a_generated_package_builds_imports_and_rebuilds_as_a_no_op(tmp_path):
    plan = resolve(load_manifest(REPO / "examples/fast-decode.yaml"), "examples/fast-decode.yaml")
    folder = tmp_path / plan.name
    write_package(render(plan), folder)

    first = build_package(folder, plan.package)
    assert first.extension.parent == folder / plan.package
    code = (
        f"import {plan.package}._hostdispatch as ext\n"
        f"assert ext.__file__.startswith({str(folder)!r}), ext.__file__\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=folder, check=True)

    stamp = first.extension.stat().st_mtime_ns
    second = build_package(folder, plan.package)
    assert "ninja: no work to do" in (folder / "build" / "build.log").read_text()
    assert second.extension.stat().st_mtime_ns == stamp  # same bytes: not rewritten

    write_package(render(plan), folder)  # compiling again keeps the build cached
    build_package(folder, plan.package)
    assert "ninja: no work to do" in (folder / "build" / "build.log").read_text()
