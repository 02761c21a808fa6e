"""Triton kernels behind TritonOps. Each rounds to the model dtype exactly where HF transformers does."""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Triton's CPU interpreter (tests without a GPU) cannot time configs: it runs the first one.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _tuned(configs, key):
    def wrap(fn):
        return fn if INTERPRET else triton.autotune(configs=configs, key=key)(fn)

    return wrap


def untuned_args(configs) -> dict:
    """Launch arguments that autotuning would have supplied (the first config), for the interpreter."""
    return dict(configs[0].kwargs) if INTERPRET else {}


# Programmatic dependent launch (Hopper): a kernel launched with it starts while the kernel before it
# drains. Everything before `_wait` may read only what no kernel of the step's chain writes: the
# weights, and what the prologue wrote before the chain began (positions, slots, the KV cache's
# earlier steps). A kernel calls `_release` as it starts, so the next one can launch and prefetch.
@triton.jit
def _wait(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _release(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, stride_x, stride_r, stride_o, stride_s, n_cols, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    _release(USE_PDL)
    _wait(USE_PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * stride_s + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    normed = (xf * rstd).to(x.dtype)
    tl.store(
        out_ptr + row * stride_o + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype), mask=mask
    )


@triton.jit
def _rope_pairs(pos_ptr, slot_ptr, cos_ptr, sin_ptr, stride_cos, i, HALF: tl.constexpr, dtype):
    """One decode row's slot, and cos and sin at columns i and i + HALF, rounded to the model dtype."""
    pos = tl.load(pos_ptr)
    slot = tl.load(slot_ptr).to(tl.int64)
    c_lo = tl.load(cos_ptr + pos * stride_cos + i).to(dtype).to(tl.float32)
    c_hi = tl.load(cos_ptr + pos * stride_cos + i + HALF).to(dtype).to(tl.float32)
    s_lo = tl.load(sin_ptr + pos * stride_cos + i).to(dtype).to(tl.float32)
    s_hi = tl.load(sin_ptr + pos * stride_cos + i + HALF).to(dtype).to(tl.float32)
    return slot, c_lo, c_hi, s_lo, s_hi


@triton.jit
def _rope_heads(
    base, n_heads, pos, cos_ptr, sin_ptr, stride_cos, norm_ptr, eps,
    HEADS_PAD: tl.constexpr, DIM: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """Load n_heads heads at `base`, apply the optional per-head RMSNorm, then RoPE; returns [HEADS_PAD, DIM]."""
    half: tl.constexpr = DIM // 2
    d = tl.arange(0, DIM)
    h = tl.arange(0, HEADS_PAD)
    rot = tl.where(d < half, d + half, d - half)
    sign = tl.where(d < half, -1.0, 1.0)
    mask = h[:, None] < n_heads
    x = tl.load(base + h[:, None] * DIM + d[None, :], mask=mask, other=0.0)
    x_rot = tl.load(base + h[:, None] * DIM + rot[None, :], mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_NORM:
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, 1) / DIM + eps)[:, None]
        w = tl.load(norm_ptr + d).to(tl.float32)
        w_rot = tl.load(norm_ptr + rot).to(tl.float32)
        x = (w[None, :] * (xf * rstd).to(dtype).to(tl.float32)).to(dtype)
        x_rot = (w_rot[None, :] * (x_rot.to(tl.float32) * rstd).to(dtype).to(tl.float32)).to(dtype)
    c = tl.load(cos_ptr + pos * stride_cos + d).to(dtype).to(tl.float32)
    s = tl.load(sin_ptr + pos * stride_cos + d).to(dtype).to(tl.float32)
    xc = (x.to(tl.float32) * c[None, :]).to(dtype)
    xs = (x_rot.to(tl.float32) * sign[None, :] * s[None, :]).to(dtype)
    return (xc.to(tl.float32) + xs.to(tl.float32)).to(dtype)


@triton.jit
def qkv_rope_cache_kernel(
    qkv_ptr, pos_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, kc_ptr, vc_ptr, slot_ptr, q_out_ptr,
    stride_qkv, stride_cos, eps,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, KV_PAD: tl.constexpr,
    DIM: tl.constexpr, HAS_NORM: tl.constexpr, USE_PDL: tl.constexpr = False,
):  # fmt: skip
    t = tl.program_id(0)
    _release(USE_PDL)
    _wait(USE_PDL)
    # Reading the position and cos/sin before the wait (as the batch-1 GEMV does) ran batch 8 and 64
    # 3-4 µs slower a step (round 21, call 5), likely since its release then came after two loads.
    pos = tl.load(pos_ptr + t)
    slot = tl.load(slot_ptr + t)
    row = qkv_ptr + t * stride_qkv
    d = tl.arange(0, DIM)
    q = _rope_heads(row, HEADS, pos, cos_ptr, sin_ptr, stride_cos, qn_ptr, eps, HEADS_PAD, DIM, HAS_NORM)
    hq = tl.arange(0, HEADS_PAD)
    tl.store(q_out_ptr + t * HEADS * DIM + hq[:, None] * DIM + d[None, :], q, mask=hq[:, None] < HEADS)
    k_base = row + HEADS * DIM
    k = _rope_heads(k_base, KV_HEADS, pos, cos_ptr, sin_ptr, stride_cos, kn_ptr, eps, KV_PAD, DIM, HAS_NORM)
    hk = tl.arange(0, KV_PAD)
    kv_mask = hk[:, None] < KV_HEADS
    dst = slot.to(tl.int64) * KV_HEADS * DIM + hk[:, None] * DIM + d[None, :]
    tl.store(kc_ptr + dst, k, mask=kv_mask)
    v = tl.load(k_base + KV_HEADS * DIM + hk[:, None] * DIM + d[None, :], mask=kv_mask, other=0.0)
    tl.store(vc_ptr + dst, v, mask=kv_mask)


@triton.jit
def silu_mul_kernel(
    gu_ptr, out_ptr, n_cols, stride_gu, stride_out, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    _release(USE_PDL)
    _wait(USE_PDL)
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + n_cols + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    tl.store(
        out_ptr + row * stride_out + cols, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=mask
    )


def _gemv_configs():
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bn, bk, w, s in [
            (4, 512, 4, 4),
            (8, 512, 4, 4),
            (8, 1024, 8, 3),
            (16, 256, 4, 4),
            (16, 512, 8, 3),
            (32, 256, 8, 3),
            (2, 1024, 4, 4),
            (4, 1024, 8, 3),
            # DESIGN.md: in a graph-replayed chain of this model's GEMVs under PDL, 2 rows x 2048
            # columns x 4 warps streamed at 82% of copy bandwidth, the best shape tried there.
            (2, 2048, 4, 2),
            (2, 2048, 4, 3),
        ]
    ]


@triton.jit
def _stream_rows(
    x_ptr, w_ptr, rows, rows2, n_mask, K, stride_wn, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
    TWO: tl.constexpr,
):  # fmt: skip
    """(w[rows] @ x, w[rows2] @ x) in fp32 over all of K for one decode row; with TWO off only the first
    is computed (the second returned is the first). The first tile of w is loaded before the wait for
    x's writer, so under programmatic dependent launch the weight stream starts while it still runs."""
    rk = tl.arange(0, BLOCK_K)
    tile = n_mask[:, None] & (rk < K)[None, :]
    w = tl.load(w_ptr + rows[:, None] * stride_wn + rk[None, :], mask=tile, other=0.0)
    if TWO:
        w2 = tl.load(w_ptr + rows2[:, None] * stride_wn + rk[None, :], mask=tile, other=0.0)
    _release(USE_PDL)
    _wait(USE_PDL)
    x = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)[None, :]
    acc = tl.sum(w.to(tl.float32) * x, 1)
    acc2 = acc
    if TWO:
        acc2 = tl.sum(w2.to(tl.float32) * x, 1)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < K
        tile = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptr + rows[:, None] * stride_wn + rk[None, :], mask=tile, other=0.0)
        x = tl.load(x_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        acc += tl.sum(w.to(tl.float32) * x, 1)
        if TWO:
            w2 = tl.load(w_ptr + rows2[:, None] * stride_wn + rk[None, :], mask=tile, other=0.0)
            acc2 += tl.sum(w2.to(tl.float32) * x, 1)
    return acc, acc2


@_tuned(_gemv_configs(), ["N", "K", "GATED"])
@triton.jit
def gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False, GATED: tl.constexpr = False,
):  # fmt: skip
    """y[N] = w[N, K] @ x[K] for one decode row: streams w once, no split-K, no atomics (deterministic).

    GATED: w holds 2N rows, gate then up, and y[j] = silu(gate_j) * up_j, rounded as a separate
    silu_mul launch after the 2N-row product would round it (the same bits at the same tile config).
    Folding the RMSNorm before it (or the SiLU-mul before down_proj) into this kernel measured slower
    on the H200 (docs/performance.md): every program redoing the norm costs more than the launch it saves.
    """
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    acc, acc_up = _stream_rows(x_ptr, w_ptr, rn, rn + N, n_mask, K, stride_wn, BLOCK_K, USE_PDL, GATED)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
    if GATED:
        out_ty = y_ptr.dtype.element_ty
        gate = acc.to(out_ty).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_ty).to(tl.float32)
        acc = act * acc_up.to(out_ty).to(tl.float32)
    tl.store(y_ptr + rn, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


@_tuned(_gemv_configs(), ["N", "K", "DIM"])
@triton.jit
def gemv_rope_cache_kernel(
    x_ptr, w_ptr, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, N, K, stride_wn, stride_cos,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False, EARLY_ROPE: tl.constexpr = True,
):  # fmt: skip
    """One decode row's q|k|v projection with RoPE and the KV-cache write in the epilogue: the GEMV, then
    qkv_rope_cache_kernel, in one launch and with no q|k|v round trip through memory.

    Program p covers BLOCK_N pairs of rows (j, j + DIM/2) of one or more heads, the two halves RoPE
    rotates into each other, so each output's rotation partner is in the same program. Outputs are
    rounded where the two launches round them: the projection, then each RoPE product and their sum.
    """
    HALF: tl.constexpr = DIM // 2
    pair = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = pair < N // 2
    head = pair // HALF
    i = pair % HALF
    lo = head * DIM + i
    hi = lo + HALF
    ty = q_ptr.dtype.element_ty
    # The epilogue's inputs that no kernel of the step's PDL chain writes (the prologue's position and
    # slot, the tables), read ahead of _stream_rows' wait so they are not on the path after it.
    if EARLY_ROPE:
        slot, c_lo, c_hi, s_lo, s_hi = _rope_pairs(
            pos_ptr, slot_ptr, cos_ptr, sin_ptr, stride_cos, i, HALF, ty
        )
    acc_lo, acc_hi = _stream_rows(x_ptr, w_ptr, lo, hi, n_mask, K, stride_wn, BLOCK_K, USE_PDL, True)
    if not EARLY_ROPE:  # bench/ab_step.py's baseline: as before round 21
        slot, c_lo, c_hi, s_lo, s_hi = _rope_pairs(
            pos_ptr, slot_ptr, cos_ptr, sin_ptr, stride_cos, i, HALF, ty
        )
    if HAS_BIAS:
        acc_lo += tl.load(b_ptr + lo, mask=n_mask, other=0.0).to(tl.float32)
        acc_hi += tl.load(b_ptr + hi, mask=n_mask, other=0.0).to(tl.float32)
    a = acc_lo.to(ty)
    b = acc_hi.to(ty)
    af, bf = a.to(tl.float32), b.to(tl.float32)
    rot_lo = ((af * c_lo).to(ty).to(tl.float32) + (bf * -1.0 * s_lo).to(ty).to(tl.float32)).to(ty)
    rot_hi = ((bf * c_hi).to(ty).to(tl.float32) + (af * s_hi).to(ty).to(tl.float32)).to(ty)
    is_q = n_mask & (head < HEADS)
    is_k = n_mask & (head >= HEADS) & (head < HEADS + KV_HEADS)
    is_v = n_mask & (head >= HEADS + KV_HEADS)
    tl.store(q_ptr + lo, rot_lo, mask=is_q)
    tl.store(q_ptr + hi, rot_hi, mask=is_q)
    kv = slot * KV_HEADS * DIM + (lo - HEADS * DIM)
    tl.store(kc_ptr + kv, rot_lo, mask=is_k)
    tl.store(kc_ptr + kv + HALF, rot_hi, mask=is_k)
    kv = kv - KV_HEADS * DIM
    tl.store(vc_ptr + kv, a, mask=is_v)
    tl.store(vc_ptr + kv + HALF, b, mask=is_v)


@triton.jit
def argmax_lse_partial_kernel(
    logits_ptr, stride_row, V, max_ptr, idx_ptr, sum_ptr, BLOCK: tl.constexpr, PARTS: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """Per chunk of a row: max, first index of the max, and sum of exp(x - max)."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    _release(USE_PDL)
    _wait(USE_PDL)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    idx = tl.min(tl.where(x == m, cols, V), 0)
    # A part wholly past the vocabulary holds only -inf: it contributes nothing (and no NaN).
    s = tl.where(m == float("-inf"), 0.0, tl.sum(tl.exp(x - m), 0))
    out = row * PARTS + part
    tl.store(max_ptr + out, m)
    tl.store(idx_ptr + out, idx)
    tl.store(sum_ptr + out, s)


@triton.jit
def argmax_lse_final_kernel(
    max_ptr, idx_ptr, sum_ptr, tokens_ptr, logprobs_ptr, V, PARTS: tl.constexpr, USE_PDL: tl.constexpr = False
):  # fmt: skip
    """Greedy token (first index of the row max, as torch.argmax) and its log-probability."""
    row = tl.program_id(0)
    _release(USE_PDL)
    _wait(USE_PDL)
    p = tl.arange(0, PARTS)
    m = tl.load(max_ptr + row * PARTS + p)
    top = tl.max(m, 0)
    idx = tl.min(tl.where(m == top, tl.load(idx_ptr + row * PARTS + p), V), 0)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, tl.load(sum_ptr + row * PARTS + p) * tl.exp(m - top)), 0)
    tl.store(tokens_ptr + row, idx.to(tl.int64))
    tl.store(logprobs_ptr + row, -tl.log(total))


def small_m_configs(block_m: int, k: int) -> list[dict]:
    """Candidate launch configs of gemm_small_m_kernel at BLOCK_M rows and K columns (bench/linear.py
    times each). The one-tile splits give every program a single tile of K, as the batch-1 GEMV does:
    the most loads in flight at once, and under PDL the whole tile read before the wait."""
    tiles = lambda bk: -(-k // bk)  # noqa: E731
    shapes = [
        (16, 256, 1, 4, 4), (32, 256, 1, 4, 4), (64, 128, 1, 4, 4), (32, 128, 4, 4, 4), (64, 256, 4, 4, 3),
        (16, 256, tiles(256), 4, 1), (16, 512, tiles(512), 4, 1), (32, 256, tiles(256), 4, 1),
    ]  # fmt: skip
    if block_m >= 64:  # a 64-row tile of x per step: fewer, narrower weight tiles in flight
        shapes = [(bn, bk, s, w, max(1, st - 1)) for bn, bk, s, w, st in shapes if bn * bk <= 8192]
    return [
        dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=s, num_warps=w, num_stages=st) for bn, bk, s, w, st in shapes
    ]


def small_m_config(m: int, n: int, k: int) -> dict | None:
    """The config the engine launches for an m-row linear, or None where cuBLAS is as fast (round 16,
    calls 1 and 2: every candidate and cuBLAS in a graph of 16 layers' weights streamed from HBM, M=8).
    A layer's square o_proj gains most from one tile of K a program, its weight read under PDL before
    the wait; down_proj from four ranges of K; the LM head from wide tiles under PDL. A kernel streaming
    w on the CUDA cores as the batch-1 GEMV does, 2-16 rows a program, ran 2-4x slower than cuBLAS
    (round 18, docs/performance.md)."""
    if n >= 65536:  # the LM head: 125 against cuBLAS's 128 µs
        return dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4, pdl=True)
    if k >= 4 * n:  # down_proj: 12.9 against 13.5 µs
        return dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=4, num_warps=4, num_stages=4, pdl=False)
    if n == k:  # o_proj: 5.2 against 6.0 µs
        return dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=-(-k // 256), num_warps=4, num_stages=1, pdl=True)
    return None  # qkv_proj (6.1 against at best 7.0 µs) and gate_up_proj (18.4 against 19.2)


SMALL_M_BLOCKS = (16, 32, 64)


@triton.jit
def _finish_small_m(acc, b_ptr, y_ptr, rm, rn, n_mask, out_mask, stride_ym, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def gemm_small_m_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """y[M, N] = x[M, K] @ w[N, K]^T for 2 <= M <= BLOCK_M <= 64: one pass over w on the tensor cores.

    Program (n, s) covers BLOCK_N outputs over the s-th of SPLIT_K ranges of K. With SPLIT_K > 1 each
    writes its fp32 partial to part_ptr and counts itself in count_ptr[n]; the last to arrive sums the
    partials in split order, so the result does not depend on which program finished last
    (deterministic), and sets the count back to zero for the next launch or graph replay.
    As in gemv_kernel, the first tile of w is loaded before the wait for x's writer.
    Computing the SiLU-mul in its loads (down_proj reading gate_up) cost batch 8 about 230 µs a step
    on the H200 (round 17, docs/performance.md): that launch stays.
    """
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_mask = rn < N
    m_mask = rm < M
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    k_lo = pid_s * per * BLOCK_K
    k_hi = tl.minimum(K, k_lo + per * BLOCK_K)
    rk = k_lo + tl.arange(0, BLOCK_K)
    w = tl.load(
        w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=n_mask[:, None] & (rk < k_hi)[None, :], other=0.0
    )
    _release(USE_PDL)
    _wait(USE_PDL)
    x = tl.load(
        x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=m_mask[:, None] & (rk < k_hi)[None, :], other=0.0
    )
    acc = tl.dot(x, tl.trans(w), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32))
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < k_hi
        w = tl.load(
            w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0
        )
        x = tl.load(
            x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0
        )
        acc = tl.dot(x, tl.trans(w), acc)
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K > 1:
        tile = rm[:, None] * N + rn[None, :]
        tl.store(part_ptr + pid_s * M * N + tile, acc, mask=out_mask)
        # Every thread's partial is stored before the one release that counts this program in.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            acc = tl.load(part_ptr + tile, mask=out_mask, other=0.0, cache_modifier=".cg")
            for s in range(1, SPLIT_K):
                acc += tl.load(part_ptr + s * M * N + tile, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + pid_n, 0)
            _finish_small_m(acc, b_ptr, y_ptr, rm, rn, n_mask, out_mask, stride_ym, HAS_BIAS)
    else:
        _finish_small_m(acc, b_ptr, y_ptr, rm, rn, n_mask, out_mask, stride_ym, HAS_BIAS)
