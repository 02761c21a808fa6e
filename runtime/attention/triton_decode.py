"""fastpath's paged decode kernel (Triton): reads only each sequence's live pages, split across the KV length.

Dense libraries gather the whole block-table width per step; at batch 1 with a long `max_seq_len` that
gather costs more than the attention. This kernel walks the block table in place instead.
"""

from __future__ import annotations

import torch

from .library import TritonFmhaLibrary

PDL = True  # a module-level switch, so bench/ab_step.py can compare with and without in one process
# Keys a loop step reads: several pages at once, since one 16-token page a step left attention
# latency-bound (23% of copy bandwidth at 8k contexts, round 18).
CHUNK_TOKENS = 64
# Split programs a step aims for: twice the H200's SMs at batch 1. A module-level value, so the
# interpreter checks can force one split over a long context.
TARGET_PROGRAMS = 256

_kernels = None


def _load_kernels():
    global _kernels
    if _kernels is not None:
        return _kernels
    import triton
    import triton.language as tl

    @triton.jit
    def split_kernel(
        q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, acc_ptr, ml_ptr, out_ptr, scale,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ot, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
        CHUNK: tl.constexpr, NUM_SPLITS: tl.constexpr, WINDOW: tl.constexpr, USE_PDL: tl.constexpr = False,
    ):  # fmt: skip
        seq = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        if USE_PDL:  # everything below may read what the kernel before wrote (q, this step's K and V)
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        ctx = tl.load(lens_ptr + seq)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_t = tl.arange(0, CHUNK)
        heads = kvh * GROUP + offs_g
        q = tl.load(
            q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=offs_g[:, None] < GROUP,
            other=0.0,
        )
        # The live context (the window's, with one) in CHUNK-token pieces, shared evenly by the splits:
        # a graph's split count is fixed, the context is not. Each piece holds at least one valid key.
        first = 0
        if WINDOW > 0:
            first = tl.maximum(ctx - WINDOW, 0) // CHUNK
        pieces = tl.cdiv(ctx, CHUNK)
        per = tl.cdiv(pieces - first, NUM_SPLITS)
        lo = (first + split * per) * CHUNK
        end = tl.minimum(first + (split + 1) * per, pieces) * CHUNK
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_sum = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        for tok0 in range(lo, end, CHUNK):
            # A whole chunk's pages at once: CHUNK // BLOCK pages' loads in flight, not one.
            pos = tok0 + offs_t
            valid = pos < ctx
            if WINDOW > 0:
                valid = valid & (pos >= ctx - WINDOW)
            page = tl.load(tables_ptr + seq * stride_bt + pos // BLOCK, mask=pos < ctx, other=0)
            kv_off = (
                page.to(tl.int64)[:, None] * stride_kb
                + (pos % BLOCK)[:, None] * stride_ks
                + kvh * stride_kh
                + offs_d[None, :]
            )
            k = tl.load(k_ptr + kv_off, mask=valid[:, None], other=0.0)
            v = tl.load(v_ptr + kv_off, mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            l_sum = l_sum * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m = m_new
        if NUM_SPLITS == 1:  # the whole context in this program: the output, with no merge
            out_rows = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
            tl.store(
                out_rows, (acc / l_sum[:, None]).to(out_ptr.dtype.element_ty), mask=offs_g[:, None] < GROUP
            )
        else:
            row = (seq * tl.num_programs(1) + kvh) * NUM_SPLITS + split
            tl.store(acc_ptr + (row * GROUP_PAD + offs_g[:, None]) * HEAD_DIM + offs_d[None, :], acc)
            tl.store(ml_ptr + (row * GROUP_PAD + offs_g) * 2, m)
            tl.store(ml_ptr + (row * GROUP_PAD + offs_g) * 2 + 1, l_sum)

    @triton.jit
    def reduce_kernel(
        acc_ptr, ml_ptr, out_ptr, stride_ot, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
        USE_PDL: tl.constexpr = False,
    ):  # fmt: skip
        seq = tl.program_id(0)
        head = tl.program_id(1)
        if USE_PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        kvh = head // GROUP
        g = head % GROUP
        offs_d = tl.arange(0, HEAD_DIM)
        base = (seq * tl.num_programs(1) // GROUP + kvh) * NUM_SPLITS
        offs_split = tl.arange(0, NUM_SPLITS)
        rows = (base + offs_split) * GROUP_PAD + g
        m = tl.load(ml_ptr + rows * 2)
        l_sum = tl.load(ml_ptr + rows * 2 + 1)
        m_max = tl.max(m, 0)
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))
        acc = tl.load(acc_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :])
        out = tl.sum(acc * w[:, None], 0) / tl.sum(l_sum * w, 0)
        tl.store(out_ptr + seq * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))

    _kernels = (split_kernel, reduce_kernel)
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
            CHUNK=chunk, NUM_SPLITS=num_splits, WINDOW=meta.sliding_window or 0, **pdl,
        )  # fmt: skip
        # Merging the splits in the split kernel (its last program to finish) measured slower at
        # batch 1 than this second launch under PDL: 1,023 against 855 µs a step (round 16, call 3).
        if num_splits > 1:
            reduce_kernel[(seqs, heads)](
                acc, ml, out, out.stride(0), out.stride(1),
                GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=dim, NUM_SPLITS=num_splits, **pdl,
            )  # fmt: skip
        return out
