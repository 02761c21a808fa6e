"""`--validate`: every check that needs no torch, in the formats CI tools read, writing nothing.

Goldens: golden/validate.{text,github,json} are the outputs for golden/*.yaml. To accept new
ones after a deliberate change: FASTPATH_UPDATE_GOLDEN=1 pytest tests/compiler/test_validate.py
"""

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from compile_helpers import EXAMPLES, REPO

from fastpath.compiler.cli import main
from fastpath.compiler.report import github_command
from fastpath.schema import json_schema_path
from fastpath.schema.errors import Diagnostic

GOLDEN = Path(__file__).parent / "golden"
MANIFESTS = ["good.yaml", "bad.yaml", "twin.yaml", "tp.yaml", "future.yaml"]
UPDATE = os.environ.get("FASTPATH_UPDATE_GOLDEN") == "1"


def validate(*args, cwd=GOLDEN, python=sys.executable, code=None):
    command = [python, "-c", code, *args] if code else [python, str(REPO / "bin/compile"), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("fmt", ["text", "github", "json"])
def test_validate_output_matches_its_golden(fmt):
    done = validate("--validate", *MANIFESTS, "--format", fmt)
    assert done.returncode == 2
    out = done.stderr if fmt == "text" else done.stdout
    golden = GOLDEN / f"validate.{fmt}"
    if UPDATE:
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")
    assert not (GOLDEN / "generated").exists()


def test_json_lists_file_line_column_path_and_message():
    done = validate("--validate", "bad.yaml", "--format", "json")
    (first, *_) = json.loads(done.stdout)
    assert first == {
        "file": "bad.yaml",
        "line": 4,
        "column": 15,
        "path": "model.checkpoint",
        "message": first["message"],
    }


def test_valid_manifests_exit_0():
    done = validate("--validate", "good.yaml", "--format", "json")
    assert (done.returncode, done.stdout) == (0, "[]\n")
    done = validate("--validate", "good.yaml")
    assert (done.returncode, done.stdout, done.stderr) == (0, "good.yaml: valid\n", "")


def test_github_commands_escape_what_the_workflow_syntax_reserves():
    d = Diagnostic("dir,x/a:b.yaml", 3, 4, "100% sure\nsecond line: here", "runtime.device")
    assert github_command(d) == (
        "::error file=dir%2Cx/a%3Ab.yaml,line=3,col=4,title=fastpath manifest::100%25 sure%0Asecond line: here"
    )


BLOCK_TORCH = """\
import importlib.abc, sys
attempts = []
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "jinja2") or name.startswith("fastpath.runtime"):
            attempts.append(name)
            raise ImportError(f"{name} is not importable here")
sys.meta_path.insert(0, Refuse())
from fastpath.compiler.cli import main
code = main(sys.argv[1:])
assert not attempts, attempts
sys.exit(code)
"""


def test_validate_needs_no_torch(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt/config.json").write_text(
        json.dumps({"num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 64})
    )
    (tmp_path / "m.yaml").write_text(
        "schema_version: 1\nname: m\nmodel: {checkpoint: ckpt}\nruntime: {device: cuda, tp: 4}\n"
    )
    done = validate("--validate", *map(str, EXAMPLES), cwd=REPO, code=BLOCK_TORCH)
    assert done.returncode == 0, done.stderr
    done = validate("--validate", "m.yaml", cwd=tmp_path, code=BLOCK_TORCH)
    assert done.returncode == 2, done.stderr  # the checkpoint's head counts were read, without torch
    assert "m.yaml:4:29: error: tensor_parallel_size 4: num_attention_heads 6 is not divisible" in done.stderr


def test_validating_every_example_takes_under_half_a_second():
    # CPU time of the whole command, start-up and imports included: wall time on this shared
    # 2-core machine swings with other work, the CPU a command needs does not.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = validate("--validate", *map(str, EXAMPLES), cwd=REPO)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert done.returncode == 0, done.stderr
    assert cpu < 0.5, f"--validate used {cpu:.2f} s of CPU ({wall:.2f} s wall)"


def test_print_schema_prints_the_schema_shipped_with_fastpath(capsys):
    assert main(["--print-schema"]) == 0
    printed = capsys.readouterr().out
    assert printed == json_schema_path().read_text(encoding="utf-8")
    assert json.loads(printed)["properties"]["schema_version"]
    assert json_schema_path().parent == Path(__import__("fastpath.schema").schema.__file__).parent


def test_without_manifests_it_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_:
        main(["--validate"])
    assert exit_.value.code == 2
