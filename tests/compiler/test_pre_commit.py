"""The pre-commit hook others add to their repositories, run as they would run it (pre-commit try-repo)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from compile_helpers import REPO

GOOD = "schema_version: 1\nname: serve-a\nmodel:\n  checkpoint: random:tiny-llama\n"
BAD = (
    "schema_version: 1\nname: serve-b\nmodel:\n  checkpoint: random:tiny-llama\n"
    "runtime:\n  max_bach_size: 8\n  max_seq_len: long\n"
)


@pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")
def test_the_hook_flags_only_the_bad_manifest_with_lines_and_columns(tmp_path):
    project = tmp_path / "project"
    (project / "deploy").mkdir(parents=True)
    (project / "deploy/a.yaml").write_text(GOOD)
    (project / "deploy/b.yaml").write_text(BAD)
    env = {
        **os.environ,
        # fastpath-compile from this environment, as a CI job that installed fastpath-llm has it
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRE_COMMIT_HOME": str(tmp_path / "cache"),
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    for command in (["git", "init", "-q"], ["git", "add", "."]):
        subprocess.run(command, cwd=project, check=True, env=env)
    try_repo = [sys.executable, "-m", "pre_commit", "try-repo", str(REPO), "fastpath-validate-system"]
    done = subprocess.run(
        [*try_repo, "--files", "deploy/a.yaml", "deploy/b.yaml"],  # what a user's `files:` selects
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert (
        "deploy/b.yaml:6:3: error: unknown key 'max_bach_size' in runtime; did you mean 'max_batch_size'?"
        in out
    )
    assert "deploy/b.yaml:7:16: error: runtime.max_seq_len: must be a valid integer, got 'long'" in out
    assert "deploy/a.yaml:" not in out  # the valid one has no message


def test_every_hook_runs_in_one_process_so_names_are_compared_across_all_files():
    import yaml

    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hooks and all(h["require_serial"] is True and h["entry"].endswith("--validate") for h in hooks)
