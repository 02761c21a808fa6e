"""Every FASTPATH_* variable the runtime reads is documented (the README's switches, or the architecture
for the tests' own); a path not worth its cost is off unless set, and a measured gain on unless turned off."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_fastpath_variable_the_runtime_reads_is_documented():
    read = set()
    for path in (ROOT / "runtime").rglob("*.py"):
        read |= set(re.findall(r"\"(FASTPATH_[A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8") + (ROOT / "docs/architecture.md").read_text()
    assert "FASTPATH_MMA_ROPE" in read
    assert sorted(v for v in read if v not in readme) == []


# (variable, probe printing what it switches, printed when unset or "0", printed when "1")
SWITCHES = [
    # the q|k|v RoPE epilogue on the tensor-core GEMV: measured too small a gain to turn on
    (
        "FASTPATH_MMA_ROPE",
        "from fastpath.runtime.kernels import triton_ops; print(triton_ops.MMA_ROPE)",
        "False",
        "True",
    ),
    # mlp_block.cu measured slower than the five ops on an H100 (round 30)
    (
        "FASTPATH_MLP_BLOCK",
        "from fastpath.runtime.kernels import triton_ops; print(triton_ops.MLP_BLOCK)",
        "False",
        "True",
    ),
]


def _assert_probe_prints(variable: str, probe: str, expected: dict[str | None, str]) -> None:
    """Run `probe` in a fresh interpreter with `variable` unset (None) or set to each key; check its output."""
    env = {k: v for k, v in os.environ.items() if k != variable}
    for value, want in expected.items():
        run_env = env if value is None else {**env, variable: value}
        done = subprocess.run(
            [sys.executable, "-c", probe], env=run_env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == want, value


@pytest.mark.parametrize(("variable", "probe", "off", "on"), SWITCHES, ids=[v for v, *_ in SWITCHES])
def test_a_path_not_worth_its_cost_is_off_unless_asked_for(variable, probe, off, on):
    _assert_probe_prints(variable, probe, {None: off, "1": on, "0": off})


# (variable, probe, printed when unset or "1", printed when "0"): measured gains, on by default
DEFAULTS_ON = [
    # both hand-written kernels' rings filled whole lines a copy (round 31)
    (
        "FASTPATH_LINES",
        "from fastpath.runtime.kernels import mlp_block, mma_gemv; "
        "print(mma_gemv.variant_for(8, 2048, False, False).lines, mlp_block.variant_for(8).lines)",
        "True True",
        "False False",
    ),
    # gate_up_proj (up to 67M elements) on the tensor-core GEMV's gated build at 2-16 rows (round 31)
    (
        "FASTPATH_MMA_GATED",
        "from fastpath.runtime.kernels import mma_gemv as m; "
        "print(m.GATED_MAX_WEIGHT > m.MAX_WEIGHT, m.GATED_UNROLL, m.GATED_STAGES)",
        "True 2 2",
        "False 1 4",
    ),
]


@pytest.mark.parametrize(("variable", "probe", "on", "off"), DEFAULTS_ON, ids=[v for v, *_ in DEFAULTS_ON])
def test_a_measured_gain_is_on_unless_turned_off(variable, probe, on, off):
    _assert_probe_prints(variable, probe, {None: on, "1": on, "0": off})
