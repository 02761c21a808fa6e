"""Names that cannot collide: a manifest never makes a package that shadows or overwrites a module."""

import json
import subprocess
import sys

import pytest
from compile_helpers import REPO

from fastpath.compiler.cli import main

MANIFEST = "schema_version: 1\nname: {name}\nmodel:\n  checkpoint: random:tiny-llama\n"


def compile_named(tmp_path, name, *args):
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(MANIFEST.format(name=name))
    return main([str(manifest), "-o", str(tmp_path / "out"), *args])


@pytest.mark.parametrize(
    "name, owner",
    [
        ("matplotlib", "the distribution 'matplotlib' installs it at"),
        ("hypothesis", "the distribution 'hypothesis' installs it at"),
        # what an installed package imports is refused wherever the manifest is checked, installed or not
        ("yaml", "a name taken by fastpath's YAML reader (PyYAML)"),
        ("torch", "a name taken by fastpath's tensor library"),
        ("fastapi", "a name taken by fastpath's HTTP server (fastpath-llm[serve])"),
        ("xgrammar", "a name taken by guided decoding"),
        (
            "prometheus-client",
            "would make the package 'prometheus_client', a name taken by fastpath's metrics",
        ),
        ("build", "a name taken by the build folder of every generated package"),
        ("pytest", "a name taken by the test runner"),
        ("json", "which shadows an existing module"),
        ("dist", "the wheelhouse folder"),
        ("sitecustomize", "the module every Python start imports"),
        ("usercustomize", "the module every Python start imports"),
        ("nvidia", "the namespace of the CUDA libraries' wheels"),
    ],
)
def test_a_name_that_imports_here_is_refused_with_its_owner_and_nothing_is_written(
    tmp_path, capsys, name, owner
):
    assert compile_named(tmp_path, name) == 2
    err = capsys.readouterr().err
    assert f"{name}.yaml:2:7: error: " in err and owner in err
    assert not (tmp_path / "out").exists()


def test_the_compilers_own_earlier_output_on_sys_path_is_not_a_collision(tmp_path, capsys, monkeypatch):
    assert compile_named(tmp_path, "mine") == 0
    monkeypatch.syspath_prepend(str(tmp_path / "out" / "mine"))  # `import mine` now finds the package
    assert compile_named(tmp_path, "mine") == 0
    # Another manifest's package of that name, or a plain folder, is someone else's.
    lock = tmp_path / "out/mine/mine/manifest.lock.json"
    lock.write_text(json.dumps({**json.loads(lock.read_text()), "name": "other"}))
    capsys.readouterr()
    assert compile_named(tmp_path, "mine", "--check") == 2
    assert "which no installed distribution owns" in capsys.readouterr().err


def test_install_into_another_python_checks_that_environment_too(tmp_path, capsys):
    # The target interpreter is asked in a subprocess (here it is this venv again): `hypothesis` is there.
    assert compile_named(tmp_path, "hypothesis", "--install", "--python", sys.executable) == 2
    err = capsys.readouterr().err
    assert f"in {sys.executable}'s environment: the distribution 'hypothesis'" in err
    assert not (tmp_path / "out").exists()


def test_python_without_install_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        compile_named(tmp_path, "fine", "--python", sys.executable)
    assert exit_.value.code == 2


def test_importing_a_compiled_but_unbuilt_package_names_the_command_that_builds_it(tmp_path):
    assert compile_named(tmp_path, "unbuilt") == 0
    done = subprocess.run(
        [sys.executable, "-c", "import unbuilt"],
        cwd=tmp_path / "out" / "unbuilt",
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: unbuilt is compiled but not built")
    assert f"fastpath-compile {tmp_path / 'unbuilt.yaml'} -o {tmp_path / 'out'} --build" in last
    assert "No module named" not in done.stderr


def test_an_unbuilt_package_compiled_elsewhere_names_its_manifest_by_file_name(tmp_path):
    """With -o outside the manifest's tree the lock keeps the file name alone (no build machine's
    folders in a package), and the message must not invent a path from it."""
    manifest = tmp_path / "src" / "away.yaml"
    manifest.parent.mkdir()
    manifest.write_text(MANIFEST.format(name="away"))
    out = tmp_path / "deep" / "out"
    assert main([str(manifest), "-o", str(out)]) == 0
    done = subprocess.run(
        [sys.executable, "-c", "import away"], cwd=out / "away", capture_output=True, text=True
    )
    last = done.stderr.strip().splitlines()[-1]
    assert f"fastpath-compile away.yaml -o {out} --build" in last, last


def test_the_checkouts_examples_are_not_collisions_of_themselves():
    done = subprocess.run(
        [sys.executable, "bin/compile", "--check", "examples/baseline.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "generated" / "baseline"), "PATH": ""},
    )
    assert done.returncode == 0, done.stderr


def test_every_import_name_of_fastpaths_requirements_is_reserved():
    """pyproject's dependencies and the extras a deployed package installs ([guided], [smollm], [serve])
    each import under a name no generated package may take."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from fastpath.schema.fieldtypes import RESERVED_PACKAGES

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    needs = [*project["dependencies"]]
    for extra in ("guided", "smollm", "serve", "build"):
        needs += project["optional-dependencies"][extra]
    imports = {
        "pyyaml": "yaml",
        "scikit-build-core": "scikit_build_core",
        "prometheus-client": "prometheus_client",
    }
    for need in needs:
        dist = re.match(r"[A-Za-z0-9_.-]+", need).group(0).lower()
        assert imports.get(dist, dist.replace("-", "_")) in RESERVED_PACKAGES, need
