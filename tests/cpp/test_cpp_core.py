"""The header-only core builds every way it is used, warning-free: each header on its own (the
installed ones and the simulated device's), a C++ program without Python that stresses every
backend (also under ThreadSanitizer), the native extension with FASTPATH_CUDA=OFF, and generated
extensions rendered from templates/hostdispatch.cpp.j2, which compile guided fill only when asked
and then pass the same host-dispatch tests as the native binding."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cpp_builders import (
    CXX,
    HEADERS,
    INCLUDE,
    REPO,
    SIM,
    WARNINGS,
    build_extension,
    cmake_build_native,
    cuda_flags,
    cuda_home,
    python_flags,
    render_generated_source,
    run,
)

# With CUDA wherever a toolkit is installed (this machine's, the H200's); CI may have none.
CUDA_CASES = [pytest.param(False, id="without-cuda")] + (
    [pytest.param(True, id="with-cuda")] if cuda_home() is not None else []
)


@pytest.mark.slow
@pytest.mark.parametrize("with_cuda", CUDA_CASES)
def test_every_header_compiles_on_its_own(tmp_path, with_cuda):
    compile_flags, _ = cuda_flags(with_cuda)

    def compile_one(header: Path) -> subprocess.CompletedProcess:
        tu = tmp_path / f"{header.stem}.cpp"
        tu.write_text(f'#include "{header}"\n')
        cmd = [
            CXX,
            "-std=c++17",
            "-fsyntax-only",
            *WARNINGS,
            *python_flags(),
            *compile_flags,
            f"-I{INCLUDE}",
            str(tu),
        ]
        return subprocess.run(cmd, capture_output=True, text=True)

    headers = sorted(HEADERS.glob("*.hpp")) + sorted(SIM.glob("*.hpp"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = dict(zip(headers, pool.map(compile_one, headers), strict=True))
    failed = {h.name: r.stderr for h, r in results.items() if r.returncode != 0}
    assert not failed, failed


@pytest.mark.slow
@pytest.mark.parametrize("sanitizer", [None, "thread"])
def test_the_core_without_python_keeps_every_count_and_order(tmp_path, sanitizer):
    exe = tmp_path / "doorbell_stress"
    flags = ["-O2"] if sanitizer is None else ["-O1", "-g", f"-fsanitize={sanitizer}"]
    source = REPO / "tests" / "cpp" / "doorbell_stress.cpp"
    run(
        [
            CXX,
            "-std=c++17",
            *flags,
            *WARNINGS,
            "-pthread",
            f"-I{INCLUDE}",
            f"-I{SIM}",
            str(source),
            "-o",
            str(exe),
        ]
    )
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING: ThreadSanitizer" not in result.stderr, result.stderr
    assert result.stdout.count(": ok (11000 callbacks)") == 4
    assert result.stdout.count(": shutdown ok") == 4


@pytest.mark.slow
def test_the_native_extension_builds_and_imports_without_cuda(tmp_path):
    so = cmake_build_native(tmp_path / "build", cuda="OFF")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('_hostdispatch', {str(so)!r})\n"
        "h = importlib.util.module_from_spec(spec); spec.loader.exec_module(h)\n"
        "info = h.build_info()\n"
        "assert info['cuda'] is False and info['cudart'] == 'none', info\n"
        "e = h.Engine('spin', device='cuda')\n"
        "assert e.backend == 'inline', e.backend\n"
        "assert e.reason == 'no CUDA (this extension was built without CUDA): callbacks run inline, in order', e.reason\n"
        "seen = []\n"
        "e.launch(0, seen.append, 1)\n"
        "assert seen == [1]\n"
        "assert 'libcudart' not in open('/proc/self/maps').read()\n"
    )
    run([sys.executable, "-c", code], cwd=tmp_path)
    assert "cudart" not in run(["ldd", str(so)]).stdout


GENERATED = [
    pytest.param("spin", "error", False, id="spin-error"),
    pytest.param("blocking", "warn_once", True, id="blocking-warn_once-guided"),
    pytest.param("auto", "warn_once", False, id="auto-warn_once"),
]
GUIDED_CLASSES = ("GuidedFill", "GuidedRow", "MatcherApi")


def guided_symbols(so: Path) -> list[str]:
    """Symbols of guided fill's C++ classes in an (unstripped) extension."""
    names = run(["nm", "-C", str(so)]).stdout.splitlines()
    return [n for n in names if any(f"hostdispatch::{c}" in n for c in (*GUIDED_CLASSES, "GuidedFillStep"))]


@pytest.mark.slow
@pytest.mark.parametrize("dispatch_mode, on_unsupported, guided", GENERATED)
def test_a_generated_extension_passes_the_same_host_dispatch_tests(
    tmp_path, dispatch_mode, on_unsupported, guided
):
    package = f"gen_{dispatch_mode}"
    source = render_generated_source(tmp_path, dispatch_mode, on_unsupported, guided)
    assert source.read_text().startswith("// @generated")
    so = build_extension(source, tmp_path / package, "_hostdispatch", with_cuda=cuda_home() is not None)
    # Guided fill is compiled in only when asked for: no class, no method, no symbol otherwise.
    assert bool(guided_symbols(so)) is guided

    check = (
        f"import {package}._hostdispatch as h\n"
        f"assert h.FIXED_MODE == {dispatch_mode!r} and h.FIXED_ON_UNSUPPORTED == {on_unsupported!r}\n"
        f"assert h.MODES == ({dispatch_mode!r},)\n"
        f"assert [hasattr(h, c) for c in {GUIDED_CLASSES!r}] == [{guided}] * 3\n"
        f"assert hasattr(h.Engine, 'launch_guided_fill') is {guided}\n"
        "print(','.join(h.BACKENDS))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    backends = run([sys.executable, "-c", check], env=env, cwd=tmp_path).stdout.strip()
    # Backends the fixed mode cannot reach are not compiled in.
    assert backends == (
        "inline,blocking" if dispatch_mode == "blocking" else "inline,blocking,hostfunc_v2,doorbell"
    )

    env["FASTPATH_HOSTDISPATCH_EXTS"] = f"{package}._hostdispatch"
    tests = [
        str(REPO / "tests" / "runtime" / f"test_hostfunc_{n}.py")
        for n in ("inline", "selection", "sim", "gil")
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", package, *tests],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
