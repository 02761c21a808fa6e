"""bench/ab_step.py's "PDL" variant is the engine as it ships: every switch it sets, at the module's default.
A variant is read as "the engine with one change"; a stale default would make every A/B compare two
changes."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
sys.path.insert(0, "bench")
from ab_step import VARIANTS
from fastpath.runtime.attention import triton_decode
from fastpath.runtime.kernels import mlp_block, mma_gemv, triton_ops
from fastpath.runtime.runner import decode_inputs

v = VARIANTS["PDL"]
engine = {
    "one_launch_prologue": decode_inputs.UNPACK_IN_ONE_LAUNCH,
    "pdl_attention": triton_decode.PDL,
    "rope_in_gemv": triton_ops.FUSE_QKV_ROPE,
    "gemv_config": triton_ops.GEMV_CONFIG,
    "early_kv": triton_decode.EARLY_KV,
    "early_rope": triton_ops.EARLY_ROPE,
    "mma_small_m": triton_ops.MMA_SMALL_M,
    "mma_rope": triton_ops.MMA_ROPE,
    "gated_max_weight": mma_gemv.GATED_MAX_WEIGHT,
    "gated_ring": (mma_gemv.GATED_UNROLL, mma_gemv.GATED_STAGES),
    "plain_ring": (mma_gemv.PLAIN_UNROLL, mma_gemv.PLAIN_STAGES),
    "mlp_block": triton_ops.MLP_BLOCK,
    "mlp_block_warps": mlp_block.WARPS,
    "lines": mma_gemv.LINES and mlp_block.LINES,
}
stale = {k: (getattr(v, k), e) for k, e in engine.items() if getattr(v, k) != e}
print(stale or "ok")
"""


def test_the_pdl_variant_is_the_engine_as_it_ships():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPATH_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok", done.stdout
