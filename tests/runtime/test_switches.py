"""Every FASTPATH_* variable the runtime reads is documented (the README's switches, or the architecture
for the tests' own), and the one for a path not yet measured on a GPU is off unless set."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_fastpath_variable_the_runtime_reads_is_documented():
    read = set()
    for path in (ROOT / "runtime").rglob("*.py"):
        read |= set(re.findall(r"\"(FASTPATH_[A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8") + (ROOT / "docs/architecture.md").read_text()
    assert "FASTPATH_MMA_ROPE" in read
    assert sorted(v for v in read if v not in readme) == []


def test_the_unmeasured_rope_epilogue_is_off_unless_asked_for():
    probe = "from fastpath.runtime.kernels import triton_ops; print(triton_ops.MMA_ROPE)"
    env = {k: v for k, v in os.environ.items() if k != "FASTPATH_MMA_ROPE"}
    for value, expected in ((None, "False"), ("1", "True"), ("0", "False")):
        run_env = env if value is None else {**env, "FASTPATH_MMA_ROPE": value}
        done = subprocess.run(
            [sys.executable, "-c", probe], env=run_env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == expected, value


def test_the_untested_gated_ring_is_off_unless_asked_for():
    """gate_up_proj's gated build (FASTPATH_MMA_GATED=1) is off by default: its gain was a few µs a step."""
    probe = (
        "from fastpath.runtime.kernels import mma_gemv as m; "
        "print(m.GATED_MAX_WEIGHT > m.MAX_WEIGHT, m.GATED_UNROLL, m.GATED_STAGES)"
    )
    env = {k: v for k, v in os.environ.items() if k != "FASTPATH_MMA_GATED"}
    for value, expected in ((None, "False 1 4"), ("1", "True 2 2"), ("0", "False 1 4")):
        run_env = env if value is None else {**env, "FASTPATH_MMA_GATED": value}
        done = subprocess.run(
            [sys.executable, "-c", probe], env=run_env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == expected, value


def test_the_slower_persistent_mlp_half_is_off_unless_asked_for():
    """mlp_block.cu (FASTPATH_MLP_BLOCK=1) measured slower than the five ops on an H100 (round 30): off."""
    probe = "from fastpath.runtime.kernels import triton_ops; print(triton_ops.MLP_BLOCK)"
    env = {k: v for k, v in os.environ.items() if k != "FASTPATH_MLP_BLOCK"}
    for value, expected in ((None, "False"), ("1", "True"), ("0", "False")):
        run_env = env if value is None else {**env, "FASTPATH_MLP_BLOCK": value}
        done = subprocess.run(
            [sys.executable, "-c", probe], env=run_env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == expected, value
