"""The Triton kernels of fastpath's paged decode attention (triton_decode.py launches them)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_chunk(q, k, v, valid, m, l_sum, acc, scale):
    """One chunk of keys and values into the online softmax's (max, sum, accumulator)."""
    s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    l_sum = l_sum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l_sum, acc


@triton.jit
def chunk_offsets(
    tables_ptr, seq, stride_bt, tok0, ctx, end, kvh, stride_kb, stride_ks, stride_kh,
    CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr,
):  # fmt: skip
    """The CHUNK positions from tok0: which hold a live key (none past `end`, a split's last chunk
    boundary), and where each one's key and value sit in the paged cache."""
    pos = tok0 + tl.arange(0, CHUNK)
    valid = (pos < ctx) & (pos < end)
    if WINDOW > 0:
        valid = valid & (pos >= ctx - WINDOW)
    # A whole chunk's pages at once: CHUNK // BLOCK pages' loads in flight, not one.
    page = tl.load(tables_ptr + seq * stride_bt + pos // BLOCK, mask=valid, other=0)
    kv_off = (
        page.to(tl.int64)[:, None] * stride_kb
        + (pos % BLOCK)[:, None] * stride_ks
        + kvh * stride_kh
        + tl.arange(0, HEAD_DIM)[None, :]
    )
    return pos, valid, kv_off


@triton.jit
def split_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, acc_ptr, ml_ptr, out_ptr, scale,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
    CHUNK: tl.constexpr, NUM_SPLITS: tl.constexpr, WINDOW: tl.constexpr, USE_PDL: tl.constexpr = False,
    EARLY_KV: tl.constexpr = True,
):  # fmt: skip
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if USE_PDL and not EARLY_KV:  # the same loads, all after the wait (bench/ab_step.py's baseline)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + offs_g
    # Before the wait for the kernel before (q|k|v, which writes q and the step's one new key and
    # value, at ctx - 1) this reads only what no kernel on the step's PDL chain writes: the lengths
    # and block tables (the prologue wrote them before the graph, or ahead of a kernel launched without
    # PDL, so before this chain could start) and the keys and values of earlier steps (a graph replay
    # ends before the next begins). So the first chunk's loads overlap q|k|v.
    ctx = tl.load(lens_ptr + seq)
    # The live context (the window's, with one) in CHUNK-token pieces, shared evenly by the splits:
    # a graph's split count is fixed, the context is not. Each piece holds at least one valid key.
    first = 0
    if WINDOW > 0:
        first = tl.maximum(ctx - WINDOW, 0) // CHUNK
    pieces = tl.cdiv(ctx, CHUNK)
    per = tl.cdiv(pieces - first, NUM_SPLITS)
    lo = (first + split * per) * CHUNK
    end = tl.minimum(first + (split + 1) * per, pieces) * CHUNK
    # No position is valid in an empty split (lo >= end).
    pos, valid, kv_off = chunk_offsets(
        tables_ptr, seq, stride_bt, lo, ctx, end, kvh, stride_kb, stride_ks, stride_kh, CHUNK, HEAD_DIM, BLOCK,
        WINDOW,
    )  # fmt: skip
    # Waiting first (the baseline), every key and value of the chunk is loaded here, as before round 21.
    earlier = (valid & ((pos < ctx - 1) | (not EARLY_KV)))[:, None]
    k = tl.load(k_ptr + kv_off, mask=earlier, other=0.0)
    v = tl.load(v_ptr + kv_off, mask=earlier, other=0.0)
    if USE_PDL and EARLY_KV:  # everything below may read what the kernel before wrote (q, the new K and V)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    q = tl.load(
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=offs_g[:, None] < GROUP,
        other=0.0,
    )
    if EARLY_KV:
        new = (valid & (pos == ctx - 1))[:, None]
        k = tl.where(new, tl.load(k_ptr + kv_off, mask=new, other=0.0), k)
        v = tl.where(new, tl.load(v_ptr + kv_off, mask=new, other=0.0), v)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    if lo < end:
        m, l_sum, acc = attend_chunk(q, k, v, valid, m, l_sum, acc, scale)
    for tok0 in range(lo + CHUNK, end, CHUNK):
        pos, valid, kv_off = chunk_offsets(
            tables_ptr, seq, stride_bt, tok0, ctx, end, kvh, stride_kb, stride_ks, stride_kh, CHUNK, HEAD_DIM,
            BLOCK, WINDOW,
        )  # fmt: skip
        k = tl.load(k_ptr + kv_off, mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + kv_off, mask=valid[:, None], other=0.0)
        m, l_sum, acc = attend_chunk(q, k, v, valid, m, l_sum, acc, scale)
    if NUM_SPLITS == 1:  # the whole context in this program: the output, with no merge
        out_rows = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(out_rows, (acc / l_sum[:, None]).to(out_ptr.dtype.element_ty), mask=offs_g[:, None] < GROUP)
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
