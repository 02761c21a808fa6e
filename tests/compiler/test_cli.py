"""bin/compile: exit codes, nothing written for an invalid manifest, --check drift, --explain."""

import json
import os
import shutil
import subprocess

import pytest
from compile_helpers import ALL_HOOKS, REPO, compile_text

from fastpath.compiler.cli import main
from fastpath.compiler.explain import explain

GOOD = "schema_version: 1\nname: {name}\nmodel:\n  checkpoint: random:tiny-llama\n"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A project folder, the working directory of the test."""
    (tmp_path / "examples").mkdir()
    for name in ("one", "two"):
        (tmp_path / "examples" / f"{name}.yaml").write_text(GOOD.format(name=name))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(repo, *args):
    return main([str(a) for a in args], prog="bin/compile")


def test_compiles_into_generated_under_the_working_directory_and_a_rerun_writes_nothing(repo, capsys):
    manifests = [repo / "examples/one.yaml", repo / "examples/two.yaml"]
    assert run(repo, *manifests) == 0
    assert (repo / "generated/one/one/__init__.py").is_file() and (
        repo / "generated/two/pyproject.toml"
    ).is_file()
    lock = json.loads((repo / "generated/one/one/manifest.lock.json").read_text())
    assert lock["manifest"]["path"] == "examples/one.yaml"  # named from the output folder's parent
    capsys.readouterr()
    assert run(repo, *manifests) == 0
    assert " 0 written" in capsys.readouterr().out


def test_o_overrides_the_output_folder_and_the_lock_names_the_manifest_from_its_parent(
    repo, tmp_path_factory
):
    def lock_path(out):
        return json.loads((out / "one/one/manifest.lock.json").read_text())["manifest"]["path"]

    assert run(repo, "examples/one.yaml", "-o", repo / "out") == 0
    assert lock_path(repo / "out") == "examples/one.yaml"
    # Outside the output folder's parent: the file name alone, whatever the working directory, so a
    # package installed elsewhere carries no trace of the build machine's folders.
    assert run(repo, repo / "examples/one.yaml", "-o", repo / "deploy/out") == 0
    assert lock_path(repo / "deploy/out") == "one.yaml"
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    assert run(repo, "examples/one.yaml", "-o", elsewhere / "out") == 0
    assert (elsewhere / "out/one/one/__init__.py").is_file() and not (repo / "generated").exists()
    assert lock_path(elsewhere / "out") == "one.yaml"
    (elsewhere / "work").mkdir()
    os.chdir(elsewhere / "work")
    assert run(repo, repo / "examples/one.yaml", "-o", elsewhere / "out") == 0
    assert lock_path(elsewhere / "out") == "one.yaml"


def test_an_invalid_manifest_exits_2_and_nothing_is_written(repo, capsys):
    (repo / "examples/bad.yaml").write_text(GOOD.format(name="bad") + "runtime:\n  max_batch: 4\n")
    code = run(repo, repo / "examples/one.yaml", repo / "examples/bad.yaml", "-o", repo / "out")
    assert code == 2
    err = capsys.readouterr().err
    assert "bad.yaml:6:3: error: unknown key 'max_batch' in runtime; did you mean 'max_batch_size'?" in err
    assert not (repo / "out").exists()


def test_two_manifests_with_one_name_exit_2(repo, capsys):
    (repo / "examples/again.yaml").write_text(GOOD.format(name="one"))
    assert run(repo, repo / "examples/one.yaml", repo / "examples/again.yaml") == 2
    assert "makes the package 'one', as " in capsys.readouterr().err
    assert not (repo / "generated").exists()


def test_names_that_normalise_to_one_package_exit_2(repo, capsys):
    (repo / "examples/a.yaml").write_text(GOOD.format(name="fast-decode"))
    (repo / "examples/b.yaml").write_text(GOOD.format(name="fast_decode"))
    assert run(repo, "examples/a.yaml", "examples/b.yaml") == 2
    err = capsys.readouterr().err
    assert "b.yaml:2:7: error: name 'fast_decode' makes the package 'fast_decode', as examples/a.yaml" in err
    assert not (repo / "generated").exists()


def test_a_missing_manifest_exits_2(repo, capsys):
    assert run(repo, repo / "examples/none.yaml") == 2
    assert "none.yaml:1:1: error: cannot read the manifest" in capsys.readouterr().err


def test_check_passes_when_up_to_date_and_names_drift_and_the_fix(repo, capsys):
    one = repo / "examples/one.yaml"
    assert run(repo, "--check", one) == 1  # nothing generated yet
    assert "missing" in capsys.readouterr().err
    run(repo, one)
    assert run(repo, "--check", one) == 0
    init = repo / "generated/one/one/__init__.py"
    init.write_text(init.read_text() + "# hand edit\n")
    one.write_text(one.read_text() + "# the manifest moved on\n")
    before = init.read_text()
    assert run(repo, "--check", one) == 1
    err = capsys.readouterr().err
    assert "generated/one/one/__init__.py: differs" in err and f"regenerate with: bin/compile {one}" in err
    assert init.read_text() == before  # --check writes nothing


def test_a_stray_file_in_the_package_is_named_to_remove_not_to_regenerate(repo, capsys):
    """Compiling again keeps a file the compiler does not own, so --check says to remove it, and a
    compile that would ship it in the wheel warns."""
    one = repo / "examples/one.yaml"
    run(repo, one)
    stray = repo / "generated/one/one/mine.py"
    stray.write_text("X = 1\n")
    capsys.readouterr()
    assert run(repo, "--check", one) == 1
    err = capsys.readouterr().err
    assert "generated/one/one/mine.py: not generated" in err and "remove them" in err
    assert "regenerate" not in err, "compiling again would not fix it"
    assert run(repo, one) == 0
    assert (
        "warning: generated/one/one/mine.py: not generated, and the wheel would ship it"
        in capsys.readouterr().err
    )


def test_a_folder_that_is_not_a_generated_package_is_left_alone(repo, capsys):
    (repo / "generated/one").mkdir(parents=True)
    (repo / "generated/one/README").write_text("mine\n")
    assert run(repo, repo / "examples/one.yaml") == 2
    assert "not a generated package" in capsys.readouterr().err
    assert os.listdir(repo / "generated/one") == ["README"]


def test_explain_prints_hooks_gates_fmha_order_and_dispatch(tmp_path, capsys):
    manifest = tmp_path / "all.yaml"
    manifest.write_text(ALL_HOOKS)
    assert main(["--explain", str(manifest)]) == 0
    out = capsys.readouterr().out
    assert (
        "on   decode_prologue  " in out
        and "fastpath.runtime.prologues:FusedDecodePrologue, declared at line 7" in out
    )
    assert "on   executor_events.before_overlap_loop  mypkg.a:check, declared at line 10" in out
    assert "auto  cuda_graphs  " in out and "cuda graph batch sizes: 1, 2, 4, 8, 16" in out
    assert "fmha order: prepend (declared at line 13), then enabled (declared at line 13)" in out
    assert "1. flex_attention" in out and "3. reference" in out
    assert "reference       available" in out  # the runtime answered for this machine
    assert "host dispatch: spin, declared at line 12: try hostfunc_v2 -> doorbell -> blocking" in out
    assert not (tmp_path / "generated").exists()


def test_explain_says_so_when_the_runtime_cannot_answer():
    plan, _ = compile_text(ALL_HOOKS)
    text = explain(plan, availability=lambda plan: "runtime not importable (ImportError: no torch)")
    assert "the runtime's default order" not in text
    assert "then enabled (declared at line 13) (runtime not importable (ImportError: no torch))" in text
    assert "    1. flex_attention\n" in text


def test_explain_names_the_all_reduce_path_under_tensor_parallelism():
    unavailable = lambda plan: "not asked"  # noqa: E731
    one, _ = compile_text(ALL_HOOKS)
    assert "all-reduce" not in explain(one, availability=unavailable)
    two, _ = compile_text(ALL_HOOKS + "runtime: {tensor_parallel_size: 2, device: cuda}\n")
    text = explain(two, availability=unavailable)
    assert "all-reduce: on CUDA, symmetric-memory one-shot up to 512 KiB and two-shot up to 8 MiB" in text
    assert "NCCL above" in text and "tp_allreduce='nccl'" in text


def test_bin_compile_says_when_it_runs_under_the_checkouts_venv(tmp_path):
    # bin/compile's shebang is the system python3; without fastpath there, it re-runs with .venv's, aloud.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    python3 = shutil.which("python3", path=env["PATH"])
    if python3 is None:
        pytest.skip("no python3 outside the venv")
    has_fastpath = subprocess.run([python3, "-c", "import fastpath.compiler"], env=env, capture_output=True)
    done = subprocess.run(
        [str(REPO / "bin/compile"), "--help"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "usage: bin/compile" in done.stdout
    if has_fastpath.returncode != 0:
        assert "bin/compile: fastpath is not installed for " in done.stderr
        assert f"running under {REPO / '.venv/bin/python'}" in done.stderr


def test_a_refused_output_folder_exits_2_before_any_package_is_written(repo, capsys):
    (repo / "generated/two").mkdir(parents=True)
    (repo / "generated/two/README").write_text("mine\n")
    assert run(repo, "examples/one.yaml", "examples/two.yaml") == 2
    assert "generated/two is not a generated package" in capsys.readouterr().err
    assert sorted(p.name for p in (repo / "generated").iterdir()) == ["two"]


def test_a_manifest_named_twice_is_validated_once_not_as_a_collision_with_itself(repo, capsys):
    assert (
        run(repo, "--validate", "examples/one.yaml", "./examples/one.yaml", repo / "examples/one.yaml") == 0
    )
    out = capsys.readouterr()
    assert out.out.count("valid") == 1 and "collid" not in out.err


def test_validate_notes_a_hook_whose_module_is_not_importable_here(repo, capsys):
    (repo / "examples/hooked.yaml").write_text(
        GOOD.format(name="hooked") + "hooks:\n  executor_events:\n    after_warmup: [site_only_hooks:warm]\n"
    )
    assert run(repo, "--validate", "examples/hooked.yaml", "examples/one.yaml") == 0
    out = capsys.readouterr()
    assert "examples/hooked.yaml: valid" in out.out
    (note,) = out.err.splitlines()
    assert (
        note.startswith("examples/hooked.yaml:") and "note: hook 'site_only_hooks:warm' not checked" in note
    )
    assert "no module 'site_only_hooks' is importable here" in note


def test_validate_checks_a_hook_module_in_the_working_directory(repo, capsys):
    """`python -m <pkg>` run from the manifest's folder imports hooks from there, so --validate looks
    there too, instead of noting the usual layout (hooks beside the manifest) as unchecked."""
    (repo / "teamhooks.py").write_text("def warm():\n    pass\n")
    (repo / "examples/hooked.yaml").write_text(
        GOOD.format(name="hooked") + "hooks:\n  executor_events:\n    after_warmup: [teamhooks:warm]\n"
    )
    assert run(repo, "--validate", "examples/hooked.yaml") != 0
    err = capsys.readouterr().err
    assert "teamhooks:warm" in err and "takes 0 positional arguments, but is called with 1" in err, err
    assert "not checked" not in err


def test_an_output_folder_that_is_a_file_is_refused_before_anything_runs(repo, capsys):
    (repo / "out").write_text("mine\n")
    assert run(repo, "examples/one.yaml", "-o", "out") == 2
    assert "error: -o out: not a folder" in capsys.readouterr().err
    assert (repo / "out").read_text() == "mine\n"
    # what writes nothing is not refused for it
    assert run(repo, "examples/one.yaml", "-o", "out", "--explain") == 0
    (repo / "generated").write_text("mine\n")
    assert run(repo, "examples/one.yaml") == 2
    assert "error: the output folder " in capsys.readouterr().err
