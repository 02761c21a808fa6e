"""render: the generated package's files, deterministic, marked, ruff-clean, data only where data belongs."""

import ast
import json
import os
import subprocess
import sys

import pytest
from compile_helpers import ALL_HOOKS, EXAMPLES, REPO, compile_text

from fastpath.compiler import cpp_headers
from fastpath.compiler.header import MARKER
from fastpath.compiler.render import RenderError, environment

BASELINE = "schema_version: 1\nname: base\nmodel:\n  checkpoint: random:tiny-llama\n"


def test_the_package_has_the_designed_layout(all_hooks):
    _, files = all_hooks
    headers = {f"src/fastpath/{h.name}" for h in cpp_headers.headers()}
    assert set(files) == {
        "pyproject.toml",
        "CMakeLists.txt",
        "src/hostdispatch.cpp",
        "all_hooks/__init__.py",
        "all_hooks/__main__.py",
        "all_hooks/executor.py",
        "all_hooks/manifest.lock.json",
        *headers,
    }
    assert list(files) == sorted(files)


def test_the_same_manifest_renders_the_same_bytes():
    assert compile_text(ALL_HOOKS)[1] == compile_text(ALL_HOOKS)[1]


def test_a_different_manifest_changes_every_header():
    _, a = compile_text(BASELINE)
    _, b = compile_text(BASELINE + "# a comment changes the hash\n")
    assert all(a[path] != b[path] for path in a)


def test_every_file_starts_with_the_generated_line_naming_manifest_and_hash(all_hooks):
    plan, files = all_hooks
    for path, text in files.items():
        first = text.splitlines()[1 if path.endswith(".json") else 0]
        assert MARKER in first, path
        assert f"from examples/test.yaml (sha256 {plan.manifest_sha256})" in first, path
    lock = json.loads(files["all_hooks/manifest.lock.json"])
    assert lock["_generated"].startswith(MARKER)


def test_header_copies_are_the_repo_headers_after_one_marker_line(all_hooks):
    _, files = all_hooks
    for header in cpp_headers.headers():
        first, rest = files[f"src/fastpath/{header.name}"].split("\n", 1)
        assert first.startswith("// ") and MARKER in first
        assert rest == header.read_text(encoding="utf-8")


def test_init_exposes_the_plan_as_plain_data(all_hooks):
    plan, files = all_hooks
    tree = ast.parse(files["all_hooks/__init__.py"])
    constants = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1
    }
    assert ast.literal_eval(constants["DEFAULTS"]) == plan.package_defaults()
    assert "dispatch_mode" not in plan.package_defaults(), (
        "the extension fixes the mode; it is not passed again"
    )
    assert "HOOKS" not in constants, "hooks are compiled into the executor, not passed at run time"
    assert ast.literal_eval(constants["MANIFEST_SHA256"]) == plan.manifest_sha256
    assert json.loads(files["all_hooks/manifest.lock.json"])["llm_kwargs"] == json.loads(
        json.dumps(plan.llm_kwargs())
    )


def test_the_executor_imports_each_declared_hook_once_by_its_path(all_hooks):
    _, files = all_hooks
    tree = ast.parse(files["all_hooks/executor.py"])
    imported = {
        (node.module, alias.name, alias.asname)
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert {
        ("fastpath.runtime.prologues", "FusedDecodePrologue", None),
        ("fastpath.runtime.events", "retain_host_pages", None),
        ("fastpath.runtime.events", "health_check", None),
        ("mypkg.a", "check", None),
        ("mypkg.b", "check", "check_2"),  # two hooks named `check`: the second is renamed
    } <= imported
    methods = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert methods == {
        "dispatch_extension",
        "starts_from_embeddings",
        "decode_prologue",
        "start",
        "steps",
        "shutdown",
    }


def test_generated_python_and_cmake_name_only_validated_identifiers(all_hooks):
    plan, files = all_hooks
    assert f"project({plan.package} LANGUAGES CXX)" in files["CMakeLists.txt"]
    assert f"install(TARGETS _hostdispatch LIBRARY DESTINATION {plan.package})" in files["CMakeLists.txt"]
    assert f'wheel.packages = ["{plan.package}"]' in files["pyproject.toml"]


def test_the_environment_refuses_to_paste_free_text_into_code():
    env = environment()
    assert env.from_string("{{ x }}").render(x="ok_identifier.dotted") == "ok_identifier.dotted"
    assert env.from_string("{{ x | py }}").render(x='a "b"') == "'a \"b\"'"
    for value in ["two words", 'x"); import os; ("', "{{ nested }}", None, 1.5, ("a",)]:
        with pytest.raises(RenderError, match="py"):
            env.from_string("{{ x }}").render(x=value)
    with pytest.raises(Exception, match="undefined"):
        env.from_string("{{ missing }}").render()


def write_tree(files, root):
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def test_generated_python_passes_ruff(tmp_path):
    for i, text in enumerate([ALL_HOOKS, BASELINE, *(e.read_text() for e in EXAMPLES)]):
        write_tree(compile_text(text)[1], tmp_path / str(i))
    ruff = [sys.executable, "-m", "ruff"]
    config = ["--config", str(REPO / "pyproject.toml")]
    for command in (
        ["check", *config, str(tmp_path)],
        ["format", "--check", "--diff", *config, str(tmp_path)],
    ):
        done = subprocess.run(ruff + command, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_rendering_does_not_depend_on_the_process():
    # Set and dict orders can follow PYTHONHASHSEED; the bytes must not.
    code = (
        "import hashlib, sys\n"
        "sys.path.insert(0, 'tests/compiler')\n"
        "from compile_helpers import ALL_HOOKS, compile_text\n"
        "files = compile_text(ALL_HOOKS)[1]\n"
        "print(hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest())\n"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(digests) == 1
