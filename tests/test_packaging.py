"""The installed package maps the house's folders to `fastpath.*` and carries the extension."""

import json
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
    (wheel,) = out.glob("fastpath_llm-*.whl")
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
        "fastpath/schema/manifest.schema.json",  # fastpath.schema.json_schema_path()
        "fastpath/runtime/kernels/mma_gemv.cu",  # NVRTC builds them at run time
        "fastpath/runtime/kernels/mlp_block.cu",
        "fastpath/runtime/kernels/ptx.cuh",  # which both include
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


GENERATE_AND_COMPARE = """
import importlib.metadata, json, sys
import fast_decode
from fastpath.runtime import LLM, SamplingParams

params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=t, seed=3) for n, t in ((8, 0), (6, 1.0))]
prompts = [[5, 6, 7, 8], [3, 9]]
with fast_decode.LLM() as generated:
    mine = [o.outputs[0].token_ids for o in generated.generate(prompts, params)]
with LLM(**fast_decode.DEFAULTS) as native:
    theirs = [o.outputs[0].token_ids for o in native.generate(prompts, params)]
dists = sorted(d.metadata["Name"] for d in importlib.metadata.distributions())
print(json.dumps({"file": fast_decode.__file__, "generated": mine, "native": theirs, "dists": dists}))
"""


@pytest.mark.slow
def test_a_built_package_installs_from_its_wheelhouse_into_a_clean_venv_and_generates(tmp_path):
    """What a deployment does: --build here, then pip install --find-links in a fresh venv elsewhere."""
    import torch

    out = tmp_path / "out"
    command = [sys.executable, str(REPO / "bin/compile"), str(REPO / "examples/fast-decode.yaml")]
    built = subprocess.run(
        [*command, "-o", str(out), "--build"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    house = out / "dist"
    assert f"wheelhouse: {house} " in built.stdout
    assert sorted(w.name.split("-")[0] for w in house.glob("*.whl")) == [
        "fastpath_gen_fast_decode",
        "fastpath_llm",
    ]
    (wheel,) = house.glob("fastpath_gen_fast_decode-*.whl")
    pinned = f"fastpath-gen-fast-decode=={wheel.name.split('-')[1]}"  # no other source's version wins
    assert f"pip install --find-links {house} {pinned}" in built.stdout

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q"]
    # torch first, this very build (the Makefile's CPU wheel), so nothing pulls a CUDA build.
    subprocess.run([*pip, f"torch=={torch.__version__}"], check=True, timeout=600)
    subprocess.run([*pip, "--find-links", str(house), pinned], check=True, timeout=600)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [str(venv / "bin/python"), "-I", "-c", GENERATE_AND_COMPARE],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(str(venv))
    assert result["generated"] == result["native"] and len(result["generated"][0]) == 8
    assert "fastpath-llm" in result["dists"] and "fastpath" not in result["dists"]

    # --install --python: into that venv, said aloud (the build itself is cached by now).
    python = str(venv / "bin/python")
    installed = subprocess.run(
        [*command, "-o", str(out), "--install", "--python", python],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert f"fastpath-gen-fast-decode: installed into {python} (--python)" in installed.stdout


def test_a_missing_optional_dependency_names_its_pip_line():
    code = (
        "import sys\n"
        "sys.modules['xgrammar'] = None  # not installed\n"
        "from fastpath.runtime import LLM\n"
        "LLM('random:tiny-qwen3', device='cpu', guided_backend='xgrammar')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode != 0
    assert "pip install 'fastpath-llm[guided]'" in done.stderr.strip().splitlines()[-1]
