"""fastpath exports its C++ core as a CMake package: a generated package's CMakeLists.txt configures
with plain CMake given `python -m fastpath.compiler.cpp_headers --cmake-dir`, and an editable
install's config names this checkout's headers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pybind11
import pytest
from cpp_builders import INCLUDE, run

from fastpath.compiler import render, resolve, write_package
from fastpath.schema import parse_manifest

MANIFEST = "schema_version: 1\nname: cmake-probe\nmodel:\n  checkpoint: random:tiny-llama\n"


def test_cmake_dir_prints_the_folder_of_the_installed_config():
    out = run([sys.executable, "-m", "fastpath.compiler.cpp_headers", "--cmake-dir"]).stdout.strip()
    config = Path(out) / "fastpathConfig.cmake"
    assert config.is_file()
    assert (Path(out) / "fastpath_hostdispatch.cmake").is_file()
    # An editable install builds against the checkout's headers, never a stale copy of them.
    assert f'"{INCLUDE}"' in config.read_text()


@pytest.mark.slow
def test_a_generated_cmakelists_configures_with_plain_cmake_on_the_exported_package(tmp_path):
    plan = resolve(parse_manifest(MANIFEST, "cmake-probe.yaml"), "cmake-probe.yaml")
    folder = tmp_path / plan.name
    write_package(render(plan), folder)
    cmake_dir = run([sys.executable, "-m", "fastpath.compiler.cpp_headers", "--cmake-dir"]).stdout.strip()
    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
    command = [cmake, "-S", str(folder), "-B", str(tmp_path / "build"), "-DFASTPATH_CUDA=OFF"]
    command += [f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]
    done = subprocess.run(command, capture_output=True, text=True)
    # Without fastpath_DIR, CMake cannot find the package: the find_package is real.
    assert done.returncode != 0 and "fastpathConfig.cmake" in done.stdout + done.stderr
    configured = run([*command, f"-Dfastpath_DIR={cmake_dir}"]).stdout
    assert f"host dispatch with CUDA: OFF (headers in {INCLUDE})" in configured
