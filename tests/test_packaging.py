"""The installed package maps the house's folders to `fastpath.*` and carries the extension."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_import_names_map_to_the_house_folders():
    import fastpath.compiler
    import fastpath.runtime
    import fastpath.schema

    for module, folder in [
        (fastpath.schema, "schema"),
        (fastpath.compiler, "compiler"),
        (fastpath.runtime, "runtime"),
    ]:
        assert Path(module.__file__).resolve().parent == REPO / folder


def test_native_extension_reports_build_and_cuda():
    import torch

    from fastpath.runtime import _hostdispatch

    info = _hostdispatch.build_info()
    assert set(info) >= {"cuda", "cuda_runtime_build_version", "cudart", "compiler"}
    assert info["cudart"] == ("static" if info["cuda"] else "none")
    assert _hostdispatch.cuda_available() is torch.cuda.is_available()


def test_importing_the_extension_does_not_load_the_driver():
    code = (
        "import fastpath.runtime._hostdispatch\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libcuda.so' not in maps, 'driver loaded at import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def _build_wheel(tmp_path: Path, cuda: str) -> Path:
    out = tmp_path / f"wheel-{cuda}"
    env = {**os.environ, "FASTPATH_CUDA": cuda}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-q",
            "-w",
            str(out),
            str(REPO),
            "-Cbuild-dir=" + str(tmp_path / f"build-{cuda}"),
        ],
        check=True,
        env=env,
    )
    (wheel,) = out.glob("fastpath-*.whl")
    return wheel


@pytest.mark.slow
@pytest.mark.parametrize("cuda", ["AUTO", "OFF"])
def test_wheel_installs_and_imports_outside_the_repo(tmp_path, cuda):
    wheel = _build_wheel(tmp_path, cuda)
    names = zipfile.ZipFile(wheel).namelist()
    for expected in [
        "fastpath/schema/__init__.py",
        "fastpath/compiler/__init__.py",
        "fastpath/runtime/__init__.py",
        "fastpath/include/fastpath/cuda_probe.hpp",
    ]:
        assert expected in names, f"{expected} missing from {wheel.name}"
    assert any(n.startswith("fastpath/runtime/_hostdispatch") and n.endswith(".so") for n in names)
    assert any(n.startswith("fastpath/templates/") for n in names)

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
    )
    # Without site, pydantic and jinja2 are absent: find the pure-Python packages, import the extension.
    code = (
        "import importlib.util, fastpath.runtime._hostdispatch as h\n"
        "for name in ('fastpath.schema', 'fastpath.compiler', 'fastpath.runtime'):\n"
        "    spec = importlib.util.find_spec(name)\n"
        f"    assert spec.origin.startswith({str(target)!r}), spec.origin\n"
        "print(h.build_info()['cuda'])\n"
    )
    # -I -S: isolated and without site, so neither the repo nor the editable install can answer the import.
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(target)!r})\n" + code],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    built_with_cuda = result.stdout.strip() == "True"
    if cuda == "OFF":
        assert not built_with_cuda
