"""fastpath's paged decode kernel (Triton): reads only each sequence's live pages, split across the KV length.

Dense libraries gather the whole block-table width per step; at batch 1 with a long `max_seq_len` that
gather costs more than the attention. This kernel walks the block table in place instead.
"""

from __future__ import annotations

import torch

from .library import TritonFmhaLibrary

PDL = True  # a module-level switch, so bench/ab_step.py can compare with and without in one process
# Under PDL the split kernel reads earlier steps' keys and values before its wait for q|k|v (round 21);
# False waits first, for bench/ab_step.py to compare.
EARLY_KV = True
# Keys a loop step reads: several pages at once, since one 16-token page a step left attention
# latency-bound (23% of copy bandwidth at 8k contexts, round 18).
CHUNK_TOKENS = 64
# Split programs a step aims for: twice the H200's SMs at batch 1. A module-level value, so the
# interpreter checks can force one split over a long context.
TARGET_PROGRAMS = 256

_kernels = None


def _load_kernels():
    global _kernels
    if _kernels is None:  # Triton imported on first use: the runtime imports without it
        from . import triton_decode_kernels as K

        _kernels = (K.split_kernel, K.reduce_kernel)
    return _kernels


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class TritonDecodeAttention(TritonFmhaLibrary):
    name = "triton_decode"
    phase = "decode"

    def forward(self, q, k_cache, v_cache, meta, scale):
        split_kernel, reduce_kernel = _load_kernels()
        seqs, heads, dim = q.shape
        kv_heads, block = k_cache.shape[2], k_cache.shape[1]
        group = heads // kv_heads
        group_pad = max(16, _next_pow2(group))
        width = meta.block_tables.shape[1]
        chunk = max(CHUNK_TOKENS, _next_pow2(block))
        # Fewer, longer splits as the batch grows; never more splits than the table has chunks.
        target_splits = max(1, TARGET_PROGRAMS // max(1, seqs * kv_heads))
        num_splits = min(_next_pow2(-(-width * block // chunk)), _next_pow2(target_splits))
        parts = seqs * kv_heads * num_splits * group_pad if num_splits > 1 else 1
        acc = torch.empty(parts, dim, device=q.device, dtype=torch.float32)
        ml = torch.empty(parts, 2, device=q.device, dtype=torch.float32)
        out = torch.empty_like(q)
        from ..kernels.triton_ops import pdl_args

        pdl = pdl_args(q) if PDL else {}
        split_kernel[(seqs, kv_heads, num_splits)](
            q, k_cache, v_cache, meta.block_tables, meta.context_lens, acc, ml, out, scale,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            meta.block_tables.stride(0), out.stride(0), out.stride(1),
            GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=dim, BLOCK=block,
            CHUNK=chunk, NUM_SPLITS=num_splits, WINDOW=meta.sliding_window or 0, EARLY_KV=EARLY_KV, **pdl,
        )  # fmt: skip
        # Merging the splits in the split kernel (its last program to finish) measured slower at
        # batch 1 than this second launch under PDL: 1,023 against 855 µs a step (round 16, call 3).
        if num_splits > 1:
            reduce_kernel[(seqs, heads)](
                acc, ml, out, out.stride(0), out.stride(1),
                GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=dim, NUM_SPLITS=num_splits, **pdl,
            )  # fmt: skip
        return out
