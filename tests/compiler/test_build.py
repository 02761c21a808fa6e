"""build: scikit-build-core builds a generated package against the installed fastpath's headers and
CMake config, in place (--no-build-isolation style) and in pip's isolated build environment from a
fastpath wheel; it imports in place; rebuilding it unchanged compiles nothing; and an extension
compiled for a manifest without guided decoding has no guided fill, yet guided requests work."""

import importlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from compile_helpers import REPO

from fastpath.compiler import build_package, render, resolve, write_package
from fastpath.runtime import _hostdispatch as native
from fastpath.schema import load_manifest, parse_manifest

GUIDED_NAMES = ("GuidedFill", "GuidedRow", "MatcherApi")
NO_GUIDED = "schema_version: 1\nname: no-guided\nmodel:\n  checkpoint: random:tiny-llama\n"


def _plan(example: str):
    return resolve(load_manifest(REPO / "examples" / f"{example}.yaml"), f"examples/{example}.yaml")


@pytest.mark.slow
def test_a_generated_package_builds_imports_and_rebuilds_as_a_no_op(tmp_path):
    plan = _plan("fast-decode")
    folder = tmp_path / plan.name
    write_package(render(plan), folder)

    first = build_package(folder, plan.package)
    assert first.extension.parent == folder / plan.package
    code = (
        f"import {plan.package}._hostdispatch as ext\n"
        f"assert ext.__file__.startswith({str(folder)!r}), ext.__file__\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=folder, check=True)
    log = (folder / "build" / "build.log").read_text()
    # The headers come from the installed fastpath (an editable install: this checkout's).
    assert f"headers in {REPO / 'cpp' / 'include'}" in log

    stamp = first.extension.stat().st_mtime_ns
    second = build_package(folder, plan.package)
    assert "ninja: no work to do" in (folder / "build" / "build.log").read_text()
    assert second.extension.stat().st_mtime_ns == stamp  # same bytes: not rewritten

    write_package(render(plan), folder)  # compiling again keeps the build cached
    build_package(folder, plan.package)
    assert "ninja: no work to do" in (folder / "build" / "build.log").read_text()


def _import_in_place(folder: Path, package: str):
    # A name no other test builds: one process cannot load two extensions of one module name.
    assert package not in sys.modules
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(package)
    finally:
        sys.path.remove(str(folder))


@pytest.mark.slow
def test_without_guided_decoding_the_extension_has_no_guided_fill_and_guided_requests_fill_in_python(
    tmp_path,
):
    pytest.importorskip("xgrammar")
    from fastpath.runtime import SamplingParams
    from fastpath.runtime.model.presets import resolve_random
    from fastpath.runtime.model.tiny_checkpoint import write_checkpoint

    plan = resolve(parse_manifest(NO_GUIDED, "no-guided.yaml"), "no-guided.yaml")
    assert plan.guided_backend == "none"
    folder = tmp_path / plan.name
    write_package(render(plan), folder)
    built = build_package(folder, plan.package)
    pkg = _import_in_place(folder, plan.package)
    ext = importlib.import_module(f"{plan.package}._hostdispatch")

    # The native binding, which has guided fill, shows that these checks can see it.
    for module, has_it in ((native, True), (ext, False)):
        assert [hasattr(module, n) for n in GUIDED_NAMES] == [has_it] * 3
        assert hasattr(module.Engine, "launch_guided_fill") is has_it
        assert (b"GuidedFill" in Path(module.__file__).read_bytes()) is has_it
    assert built.extension.samefile(ext.__file__)

    # A guided override on this package runs, with the Python fill.
    checkpoint = write_checkpoint(tmp_path / "tiny-llama", resolve_random("random:tiny-llama", 0))
    pattern = r"[a-z]{3,6}@[a-z]{2,5}\.(com|org)"
    params = SamplingParams(max_tokens=200, temperature=1.0, seed=3, guided={"regex": pattern})
    with pkg.LLM(model=str(checkpoint), guided_backend="xgrammar", device="cpu") as llm:
        assert llm.executor.dispatcher.extension is ext
        assert llm.executor.guided.fill == "python"
        out = llm.generate(["mail: "], [params])[0].outputs[0]
    assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), out.text


def _fastpath_wheel(tmp_path: Path) -> Path:
    out = tmp_path / "wheelhouse"
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-build-isolation",
        "--no-deps",
        "-w",
        str(out),
    ]
    command += [f"-Cbuild-dir={tmp_path / 'fastpath-build'}", "-Ccmake.define.FASTPATH_CUDA=OFF", str(REPO)]
    subprocess.run(command, check=True)
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.mark.slow
def test_an_isolated_build_finds_the_headers_in_the_fastpath_wheel(tmp_path):
    wheel = _fastpath_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "fastpath/share/cmake/fastpath/fastpathConfig.cmake" in names
    assert "fastpath/include/fastpath/dispatch_module.hpp" in names
    assert not any("_hostdispatch_sim" in n or "sim_device" in n for n in names)  # test-only

    plan = _plan("baseline")
    folder = tmp_path / plan.name
    write_package(render(plan), folder)
    # fastpath from this wheel, and its torch the one already here (the CPU build on local disk).
    distribution, version = wheel.name.split("-")[:2]
    import torch

    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"{distribution}=={version}\ntorch=={torch.__version__}\n")
    out = tmp_path / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--find-links", str(wheel.parent)]
    command += ["-w", str(out), "-Ccmake.define.FASTPATH_CUDA=OFF", str(folder)]
    # pip 26.2 and newer apply only build constraints inside the isolated build environment; without
    # them it takes the newest torch there, a CUDA build of several GB.
    env = {**os.environ, "PIP_CONSTRAINT": str(constraints), "PIP_BUILD_CONSTRAINT": str(constraints)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    (built,) = out.glob("*.whl")
    with zipfile.ZipFile(built) as zf:
        (so_name,) = [n for n in zf.namelist() if n.startswith(f"{plan.package}/_hostdispatch")]
        assert not any(n.endswith(".hpp") for n in zf.namelist())
        so = tmp_path / Path(so_name).name
        so.write_bytes(zf.read(so_name))
    code = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('_hostdispatch', {str(so)!r})\n"
        "h = importlib.util.module_from_spec(spec); spec.loader.exec_module(h)\n"
        "print(h.FIXED_MODE, h.build_info()['cuda'], hasattr(h, 'GuidedFill'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert result.stdout.split() == [plan.dispatch_mode, "False", "False"]
