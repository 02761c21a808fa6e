#!/usr/bin/env python3
"""A/B of a decode step's launch path on the 1.24B Llama, in one process, on one GPU.

Engines built one after the other, each timed at the same batch sizes (`--variants` picks):
- "per-field prologue, no PDL": the native prologue slicing the staged inputs with a launch per
  field, and the per-token kernels launched one after the other;
- "one-launch prologue, no PDL": the prologue as one launch (kernels/decode_unpack.py);
- "PDL, not attention": also programmatic dependent launch between the per-token kernels (norms,
  RoPE, SiLU-mul, the batch-1 GEMVs, greedy sampling), so a GEMV's weight stream starts while the
  kernel before it drains;
- "PDL, RoPE apart": the decode attention kernels launched that way too (all of FASTPATH_PDL=1),
  with the batch-1 q|k|v GEMV and RoPE's launch apart and the GEMVs autotuned, as before round 20;
- "PDL, GEMV autotuned": RoPE and the KV-cache write in the batch-1 q|k|v GEMV's epilogue, the
  GEMVs at the autotuner's picks (the JSON lists them);
- "PDL, GEMV 4x1024": every batch-1 GEMV at 4 rows by 1024 columns a program;
- "PDL, attention waits first": decode attention's split kernel waits for q|k|v before any load and
  then loads as before round 21;
- "PDL, RoPE tables after the wait": the batch-1 q|k|v GEMV's epilogue reads the position, slot and
  cos/sin after its wait, as before round 21;
- "PDL, small-M on Triton and cuBLAS": 2-16 rows' linears as round 21 ran them (the small-M Triton
  kernel for o_proj, down_proj and the LM head, cuBLAS and the SiLU-mul kernel for the rest);
- "PDL, q|k|v RoPE in the tensor-core GEMV": 2-16 rows' q|k|v projection with RoPE and the KV-cache
  write in mma_gemv.cu's epilogue (triton_ops.MMA_ROPE, off in the engine until this times it);
- "PDL, gate_up on cuBLAS": 2-16 rows' gate_up_proj (33.5M elements) on cuBLAS and the SiLU-mul kernel
  (FASTPATH_MMA_GATED=0), as rounds 22-30 ran it, not on mma_gemv.cu's gated build;
- "PDL, gate_up gated on the tensor-core GEMV, ring 1x4": the gated build with round 22's ring (one
  chunk a slot, four slots);
- "PDL, MLP half in one persistent launch": 1-16 rows' o_proj, MLP norm, gate_up_proj, SiLU-mul and
  down_proj in one launch (mlp_block.cu, triton_ops.MLP_BLOCK), five launches' ramps and tails gone;
  ", 16 warps": with 16 warps a block at 1-8 rows (two slots each) in place of 8 (four);
- "PDL, per-lane rings": mma_gemv.cu's and mlp_block.cu's rings filled per lane, each lane copying its
  own fragments' pieces (FASTPATH_LINES=0), not a row segment at a time in whole 128-byte lines;
- "PDL, plain ring 2x2": mma_gemv.cu's plain builds with two slots of two chunks (32 KB a block), not
  four (64 KB);
- "PDL, round 30's linears": the rings per lane and gate_up on cuBLAS, as rounds 22-30 ran them;
- "PDL": the engine as it is: every batch-1 GEMV at 2 rows by 2048 columns a program, the split
  kernel reading earlier steps' keys and values before its wait, the RoPE GEMV its tables, and 2-16
  rows' linears on the tensor-core GEMV (mma_gemv.cu) with whole-line rings, gate_up_proj on its gated
  build.

The variants of round 20 and before read all of that after each wait, as those rounds did.

Columns as in bench/decode.py: the engine's counted step, its graph replayed alone, and the host's
own work in a step.

    python bench/ab_step.py --out DIR [--batch 1 8 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth, environment, markdown_table, write_outputs
from decode import MODEL, engine_step_time, replay_time, weight_bytes

ENGINE_GEMV = (2, 2048, 4, 2)  # triton_ops.GEMV_CONFIG, the engine's default


@dataclass(frozen=True, slots=True)
class Variant:
    """The module switches a variant sets before its engine is built; the defaults are the engine's."""

    one_launch_prologue: bool = True  # decode_inputs.UNPACK_IN_ONE_LAUNCH
    pdl: bool = True  # FASTPATH_PDL
    pdl_attention: bool = True  # triton_decode.PDL
    rope_in_gemv: bool = True  # triton_ops.FUSE_QKV_ROPE
    gemv_config: tuple[int, int, int, int] | None = ENGINE_GEMV  # triton_ops.GEMV_CONFIG; None: autotuned
    early_kv: bool = True  # triton_decode.EARLY_KV
    early_rope: bool = True  # triton_ops.EARLY_ROPE
    mma_small_m: bool = True  # triton_ops.MMA_SMALL_M
    mma_rope: bool = False  # triton_ops.MMA_ROPE (FASTPATH_MMA_ROPE=1)
    # mma_gemv.GATED_MAX_WEIGHT and (GATED_UNROLL, GATED_STAGES): gate_up_proj on the gated build (the
    # engine's), or at 1 << 24 on cuBLAS and the SiLU-mul kernel (FASTPATH_MMA_GATED=0)
    gated_max_weight: int = 1 << 26
    gated_ring: tuple[int, int] = (2, 2)
    plain_ring: tuple[int, int] = (2, 4)  # mma_gemv.PLAIN_UNROLL, PLAIN_STAGES
    mlp_block: bool = False  # triton_ops.MLP_BLOCK (FASTPATH_MLP_BLOCK=1)
    mlp_block_warps: int = 8  # mlp_block.WARPS: its warps a block at 1-8 rows
    lines: bool = True  # mma_gemv.LINES and mlp_block.LINES (FASTPATH_LINES)

    def apply(self) -> None:
        from fastpath.runtime.attention import triton_decode
        from fastpath.runtime.kernels import mlp_block, mma_gemv, triton_ops
        from fastpath.runtime.runner import decode_inputs

        decode_inputs.UNPACK_IN_ONE_LAUNCH = self.one_launch_prologue
        os.environ["FASTPATH_PDL"] = "1" if self.pdl else "0"
        triton_ops.pdl_available.cache_clear()
        triton_decode.PDL, triton_decode.EARLY_KV = self.pdl_attention, self.early_kv
        triton_ops.FUSE_QKV_ROPE, triton_ops.GEMV_CONFIG = self.rope_in_gemv, self.gemv_config
        triton_ops.EARLY_ROPE, triton_ops.MMA_SMALL_M = self.early_rope, self.mma_small_m
        triton_ops.MMA_ROPE, triton_ops.MLP_BLOCK = self.mma_rope, self.mlp_block
        mlp_block.WARPS = self.mlp_block_warps
        mma_gemv.LINES = mlp_block.LINES = self.lines
        mma_gemv.GATED_MAX_WEIGHT = self.gated_max_weight
        mma_gemv.GATED_UNROLL, mma_gemv.GATED_STAGES = self.gated_ring
        mma_gemv.PLAIN_UNROLL, mma_gemv.PLAIN_STAGES = self.plain_ring


ROUND_20 = dict(early_kv=False, early_rope=False)  # the loads of rounds 20 and before, after each wait
VARIANTS = {
    "per-field prologue, no PDL": Variant(one_launch_prologue=False, pdl=False, pdl_attention=False),
    "one-launch prologue, no PDL": Variant(pdl=False, pdl_attention=False),
    "PDL, not attention": Variant(pdl_attention=False),
    "PDL, RoPE apart": Variant(rope_in_gemv=False, gemv_config=None, **ROUND_20),
    "PDL, GEMV autotuned": Variant(gemv_config=None, **ROUND_20),
    "PDL, GEMV 4x1024": Variant(gemv_config=(4, 1024, 8, 3), **ROUND_20),
    "PDL, attention waits first": Variant(early_kv=False),
    "PDL, RoPE tables after the wait": Variant(early_rope=False),
    "PDL, small-M on Triton and cuBLAS": Variant(mma_small_m=False),
    "PDL, q|k|v RoPE in the tensor-core GEMV": Variant(mma_rope=True),
    "PDL, gate_up on cuBLAS": Variant(gated_max_weight=1 << 24),
    "PDL, gate_up gated on the tensor-core GEMV, ring 1x4": Variant(gated_ring=(1, 4)),
    "PDL, MLP half in one persistent launch": Variant(mlp_block=True),
    "PDL, MLP half in one persistent launch, 16 warps": Variant(mlp_block=True, mlp_block_warps=16),
    "PDL, round 30's linears": Variant(lines=False, gated_max_weight=1 << 24, gated_ring=(1, 4)),
    "PDL, plain ring 2x2": Variant(plain_ring=(2, 2)),
    "PDL, per-lane rings": Variant(lines=False),
    "PDL": Variant(),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--name", default="ab_step")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--rounds", type=int, default=1, help="times through the variants, in turn")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/ab_step.py needs a CUDA device")
        return
    from fastpath.runtime import LLM

    bw = copy_bandwidth()
    payload = {"env": environment(), "copy_bandwidth_bytes_per_s": bw, "rows": []}
    rows = []
    for rnd in range(args.rounds):
        for name in args.variants:
            VARIANTS[name].apply()
            llm = LLM(MODEL, device="cuda", dtype="bfloat16", max_batch_size=max(args.batch), max_seq_len=512)
            floor = weight_bytes(llm) / bw
            for b in args.batch:
                step, diff, _, host = engine_step_time(llm, b, 8, 40, 3)
                replay = replay_time(llm, b, "greedy")
                row = {"variant": name, "round": rnd, "batch": b, "step_s": step, "diff_step_s": diff}
                row |= {"replay_s": replay, "host_step_s": host, "floor_step_s": floor}
                payload["rows"].append(row)
                rows.append([
                    name, rnd, b, f"{step * 1e6:.0f}", f"{replay * 1e6:.0f}" if replay else "—",
                    f"{step / replay:.3f}" if replay else "—", f"{host * 1e6:.0f}", f"{floor / step:.0%}",
                ])  # fmt: skip
                print(rows[-1], flush=True)
            llm.close()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    Variant().apply()
    os.environ.pop("FASTPATH_PDL", None)
    payload["gemv_autotuned"] = _autotuned()
    headers = [
        "variant",
        "round",
        "batch",
        "µs/step",
        "replay µs",
        "wall / replay",
        "host µs",
        "share of floor",
    ]
    write_outputs(args.out, args.name, payload, markdown_table(headers, rows))


def _autotuned() -> dict:
    """The batch-1 GEMVs' configs the autotuner picked in this process, by (N, K, flag) key."""
    from fastpath.runtime.kernels import triton_kernels as K

    picks = {}
    for name in ("gemv_kernel", "gemv_rope_cache_kernel"):
        for key, config in getattr(getattr(K, name), "cache", {}).items():
            picks[f"{name}{key}"] = str(config)
    return picks


if __name__ == "__main__":
    main()
