"""fastpath's paged prefill kernel (Triton): every sequence of a prefill step in one launch per layer.

The dense libraries run a prefill step one sequence at a time, gathering each sequence's keys out of
the paged cache first: a step of 16 prompts is 16 gathers and 16 kernels per layer, and the host,
not the GPU, sets its pace. This kernel reads each sequence's pages in place. A program is one tile
of BLOCK_M queries of one sequence and one head; tiles never straddle sequences, so a token's result
does not depend on what else is in the step. A query at absolute position p sees keys 0..p (and only
the last `sliding_window` of them).
"""

from __future__ import annotations

import torch

from .library import KernelRefused, TritonFmhaLibrary

BLOCK_M = 64  # queries per program; one size, so a token's sums never depend on the step's shape

_kernel = None


def _load_kernel():
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["stride_bt"])  # the table width changes from step to step
    def prefill_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr, tiles_ptr, scale,
        stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_ks, stride_kh, stride_bt,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr,
        WINDOW: tl.constexpr,
    ):  # fmt: skip
        tile = tl.program_id(0)
        head = tl.program_id(1)
        kvh = head // GROUP
        seq = tl.load(tiles_ptr + tile * 4)
        first = tl.load(tiles_ptr + tile * 4 + 1)  # the sequence's first query row in q
        off = tl.load(tiles_ptr + tile * 4 + 2)  # this tile's first query within the sequence
        qlen = tl.load(tiles_ptr + tile * 4 + 3)
        ctx = tl.load(lens_ptr + seq)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_s = tl.arange(0, BLOCK)
        rows = off + offs_m
        live = rows < qlen
        pos = ctx - qlen + rows  # each query's absolute position
        q = tl.load(
            q_ptr + (first + rows).to(tl.int64)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
            mask=live[:, None],
            other=0.0,
        )
        hi = tl.minimum(ctx, ctx - qlen + off + BLOCK_M)  # one past the tile's last visible key
        lo = 0
        if WINDOW > 0:
            lo = tl.maximum(0, ((ctx - qlen + off - WINDOW + 1) // BLOCK) * BLOCK)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for tok0 in range(lo, hi, BLOCK):
            page = tl.load(tables_ptr + seq * stride_bt + tok0 // BLOCK)
            kv_off = (
                page.to(tl.int64) * stride_kb
                + offs_s[:, None] * stride_ks
                + kvh * stride_kh
                + offs_d[None, :]
            )
            k = tl.load(k_ptr + kv_off)
            v = tl.load(v_ptr + kv_off)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            keys = tok0 + offs_s
            seen = (keys[None, :] <= pos[:, None]) & (keys[None, :] < ctx)
            if WINDOW > 0:
                seen = seen & (keys[None, :] > pos[:, None] - WINDOW)
            s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            # A row that has seen no key yet (a window's first pages) stays all zero, not NaN.
            base = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - base[:, None])
            alpha = tl.exp(m - base)
            l_sum = l_sum * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m = m_new
        out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
        tl.store(
            out_ptr + (first + rows).to(tl.int64)[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=live[:, None],
        )

    _kernel = prefill_kernel
    return _kernel


def tile_map(query_lens: list[int], block_m: int) -> list[int]:
    """(sequence, its first query row, the tile's first query, the sequence's query count) per tile, flat."""
    tiles, first = [], 0
    for seq, qlen in enumerate(query_lens):
        for off in range(0, qlen, block_m):
            tiles += (seq, first, off, qlen)
        first += qlen
    return tiles


class TritonPrefillAttention(TritonFmhaLibrary):
    name = "triton_prefill"
    phase = "prefill"
    batched_prefill = True

    def forward(self, q, k_cache, v_cache, meta, scale):
        kernel = _load_kernel()
        _, heads, dim = q.shape
        kv_heads, block = k_cache.shape[2], k_cache.shape[1]
        if block < 16 or block & (block - 1):
            raise KernelRefused(f"triton_prefill needs a power-of-two cache block >= 16, got {block}")
        tiles = meta.host_table("prefill_tiles", BLOCK_M, lambda: tile_map(meta.query_lens, BLOCK_M))
        # A captured step's padding rows get no tile: zeros keep their hidden states finite, so the
        # keys and values they write to the null slot never poison a dense library's masked reads.
        out = torch.zeros_like(q) if meta.capturing else torch.empty_like(q)
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources

        try:
            kernel[(tiles.shape[0] // 4, heads)](
                q, k_cache, v_cache, out, meta.block_tables, meta.context_lens, tiles, scale,
                q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
                GROUP=heads // kv_heads, HEAD_DIM=dim, BLOCK_M=BLOCK_M, BLOCK=block,
                WINDOW=meta.sliding_window or 0,
            )  # fmt: skip
        except (CompilationError, OutOfResources) as exc:  # the next library takes the call
            raise KernelRefused(f"triton_prefill cannot run head_dim={dim} here: {exc}") from exc
        return out
