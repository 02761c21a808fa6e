"""The general sampler (definition: sampling.py) as five Triton kernels, with no sort of the vocabulary.

Most rows keep few tokens (a top-k, or a peaked distribution under top-p/min_p), so the kernels
first gather, for each row, every token above a threshold chosen to leave at most CANDIDATES of them,
and decide the row on those alone when that is provably exact. The passes over the vocabulary run
CHUNK logits per program, so a row spreads over many SMs:

1. stats: per chunk, the raw logits' max and exp-sum, the penalized scores' max and first argmax.
2. hist: per chunk, the total mass (fixed point) and a histogram of each token's distance below the
   row's top score (and below the top raw logit, for the top-k logprobs), in buckets 1/8 apart on a
   log scale of the float order.
3. select (a program per row): the deepest bucket that keeps the candidates within their cap, and
   each chunk's offset in the candidate list, so the list is in token order whatever the timing.
4. gather: the candidates, and per chunk the best score left out.
5. final (a program per row): the candidates sorted by (score desc, index asc) with the exact
   top-k/top-p/min_p rules and the Gumbel draw. A row whose kept set may reach past the
   candidates (a flat distribution under top-p alone, ties over the cap) takes the exact slow path
   in the same program: a rejection loop over the whole row whose candidate only moves up the
   order, bisecting the undecided range at each pass; the top-k logprobs likewise. Then the token
   is counted in the row's penalty-table slot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sampling import COUNT_MASK, PROMPT_BIT, STOP_BIT

CHUNK = 4096  # logits per program in the row-parallel passes
BLOCK = 1024  # logits per loop iteration
BUCKETS = 256
CANDIDATES = 128  # sampling candidates per row
RAW_CANDIDATES = 64  # top-k logprob candidates per row (k <= 20)
PIVOTS = 8  # pivots per pass of the slow path's searches
_COUNT = tl.constexpr(COUNT_MASK)
_PROMPT = tl.constexpr(PROMPT_BIT)
_STOP = tl.constexpr(STOP_BIT)


@triton.jit
def _key(v):
    """fp32 -> uint64 in [0, 2**32) in the float order (-0.0 and 0.0 equal)."""
    b = v.to(tl.int32, bitcast=True).to(tl.int64)
    k = tl.where(b < 0, ~b, b + 2147483648)
    k = tl.where(k == 2147483647, 2147483648, k)
    return k.to(tl.uint64)


@triton.jit
def _unkey(k):
    b = tl.where(k >= 2147483648, k - 2147483648, ~k & 0xFFFFFFFF).to(tl.int64)
    return b.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _order(key, cols):
    """(score desc, index asc) as one uint64: larger comes first."""
    return (key << 32) | (4294967295 - cols.to(tl.uint64))


@triton.jit
def _bucket(d):
    """A distance in the float order (uint64) -> [0, 240): exact below 16, then 8 per octave."""
    bits = d.to(tl.float64).to(tl.int64, bitcast=True)
    e = ((bits >> 52) & 2047) - 1023
    m = (bits >> 49) & 7
    return tl.where(d < 16, d.to(tl.int64), 16 + (e - 4) * 8 + m).to(tl.int32)


@triton.jit
def _mass(s, top):
    q = tl.where(s > float("-inf"), tl.floor(tl.exp(s - top) * 4294967296.0), 0.0)
    return q.to(tl.int64)


@triton.jit
def _uniform(seed, counter, cols):
    x = seed.to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15 + counter.to(tl.uint64, bitcast=True)
    x = x * 0x9E3779B97F4A7C15 + cols.to(tl.uint64)
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    x = x ^ (x >> 31)
    return (((x >> 40) & 0xFFFFFF).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _gumbel(seed, counter, cols):
    return -tl.log(-tl.log(_uniform(seed, counter, cols)))


# A row's parameters: SamplingTensors' fields, in its order; float ones hold float32 bits.
NFIELDS = 11
_NF = tl.constexpr(NFIELDS)


@triton.jit
def _f(prow, field):
    return tl.load(prow + field).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _i(prow, field):
    return tl.load(prow + field)


@triton.jit
def _scores(row, cols, V, logits_ptr, stride_l, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b):
    """(in bounds, raw fp32 logits, penalized scores over the temperature) of one row's `cols`.

    `p_ptr` points at the row's parameters (SamplingTensors' layout: `_f`, `_i`).
    """
    inb = cols < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_l + cols, mask=inb, other=float("-inf")).to(tl.float32)
    temp = _f(p_ptr, 0)
    rep = _f(p_ptr, 3)
    pres = _f(p_ptr, 4)
    freq = _f(p_ptr, 5)
    slot = _i(p_ptr, 9)
    ban = _i(p_ptr, 8) < _i(p_ptr, 10)
    word = tl.load(bits_ptr + slot * stride_b + (cols >> 5), mask=inb, other=0)
    hit = ((word >> (cols & 31)) & 1) != 0
    e = tl.load(ent_ptr + slot * stride_e + cols, mask=inb & hit, other=0)
    count = e & _COUNT
    seen = (e & (_COUNT | _PROMPT)) != 0
    pen = tl.where(seen, tl.where(x > 0, tl.math.div_rn(x, rep), x * rep), x)
    pen = pen - freq * count.to(tl.float32)
    pen = pen - pres * (count > 0).to(tl.float32)
    pen = tl.where(ban, tl.where((e & _STOP) != 0, float("-inf"), pen), pen)
    s = pen * tl.math.div_rn(1.0, tl.where(temp > 0, temp, 1.0))
    return inb, x, tl.where(inb, s, float("-inf"))


@triton.jit
def _stats_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, sidx_ptr, P,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    part = tl.program_id(1)
    prow = p_ptr + row * _NF
    rmax = tl.full([BLOCK], float("-inf"), tl.float32)
    rsum = tl.zeros([BLOCK], tl.float32)
    smax = tl.full([BLOCK], float("-inf"), tl.float32)
    sidx = tl.full([BLOCK], 2147483647, tl.int32)
    for i in range(0, CHUNK, BLOCK):
        cols = part * CHUNK + i + tl.arange(0, BLOCK)
        _inb, x, s = _scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
        m = tl.maximum(rmax, x)
        rsum = tl.where(m == float("-inf"), 0.0, rsum * tl.exp(rmax - m) + tl.exp(x - m))
        rmax = m
        better = s > smax
        sidx = tl.where(better, cols, sidx)
        smax = tl.where(better, s, smax)
    top_raw = tl.max(rmax, 0)
    raw_sum = tl.sum(tl.where(rmax == float("-inf"), 0.0, rsum * tl.exp(rmax - top_raw)), 0)
    top = tl.max(smax, 0)
    first = tl.min(tl.where(smax == top, sidx, 2147483647), 0)
    out = stat_ptr + (row * P + part) * 3
    tl.store(out + 0, top_raw)
    tl.store(out + 1, raw_sum)
    tl.store(out + 2, top)
    tl.store(sidx_ptr + row * P + part, first)


@triton.jit
def _row_tops(stat_ptr, row, P, PMAX: tl.constexpr):
    p = tl.arange(0, PMAX)
    base = stat_ptr + (row * P + p) * 3
    top_raw = tl.max(tl.load(base + 0, mask=p < P, other=float("-inf")), 0)
    top = tl.max(tl.load(base + 2, mask=p < P, other=float("-inf")), 0)
    return top_raw, top


@triton.jit
def _hist_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, P, hist_ptr,
    rhist_ptr, zpart_ptr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, PMAX: tl.constexpr, NB: tl.constexpr, TOPK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    part = tl.program_id(1)
    prow = p_ptr + row * _NF
    top_raw, top = _row_tops(stat_ptr, row, P, PMAX)
    key_top = _key(top)
    key_raw = _key(top_raw)
    hist = tl.zeros([NB], tl.int32)
    rhist = tl.zeros([NB], tl.int32)
    z = tl.zeros([BLOCK], tl.int64)
    for i in range(0, CHUNK, BLOCK):
        cols = part * CHUNK + i + tl.arange(0, BLOCK)
        inb, x, s = _scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
        z += _mass(s, top)
        hist += tl.histogram(_bucket(key_top - _key(s)), NB, mask=inb)
        if TOPK:
            rhist += tl.histogram(_bucket(key_raw - _key(x)), NB, mask=inb)
    b = tl.arange(0, NB)
    tl.store(hist_ptr + (row * P + part) * NB + b, hist)
    if TOPK:
        tl.store(rhist_ptr + (row * P + part) * NB + b, rhist)
    tl.store(zpart_ptr + row * P + part, tl.sum(z, 0))


@triton.jit
def _cut(hist_ptr, row, P, cap, PMAX: tl.constexpr, NB: tl.constexpr):
    """The deepest bucket whose cumulative count stays within `cap` (-1: none), the count it
    keeps, each chunk's offset of those, then of the next bucket's members, and that bucket's count."""
    p = tl.arange(0, PMAX)
    b = tl.arange(0, NB)
    h = tl.load(hist_ptr + (row * P + p[:, None]) * NB + b[None, :], mask=(p < P)[:, None], other=0)
    total = tl.sum(h, 0)
    cum = tl.cumsum(total, 0)
    cut = tl.max(tl.where(cum <= cap, b, -1), 0)
    kept = tl.sum(tl.where(b <= cut, total, 0), 0)
    per = tl.sum(tl.where(b[None, :] <= cut, h, 0), 1)
    nxt = tl.sum(tl.where(b[None, :] == cut + 1, h, 0), 1)
    return cut, kept, tl.cumsum(per, 0) - per, tl.cumsum(nxt, 0) - nxt, tl.sum(nxt, 0)


@triton.jit
def _select_kernel(
    hist_ptr, rhist_ptr, P, sel_ptr, off_ptr, roff_ptr, rnext_ptr,
    CAP: tl.constexpr, RCAP: tl.constexpr, PMAX: tl.constexpr, NB: tl.constexpr, TOPK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    p = tl.arange(0, PMAX)
    cut, kept, off, _, _ = _cut(hist_ptr, row, P, CAP, PMAX, NB)
    tl.store(off_ptr + row * P + p, off, mask=p < P)
    tl.store(sel_ptr + row * 6 + 0, cut)
    tl.store(sel_ptr + row * 6 + 1, kept)
    if TOPK:
        rcut, rkept, roff, rnext, rcount = _cut(rhist_ptr, row, P, RCAP, PMAX, NB)
        tl.store(roff_ptr + row * P + p, roff, mask=p < P)
        tl.store(rnext_ptr + row * P + p, rnext, mask=p < P)
        tl.store(sel_ptr + row * 6 + 2, rcut)
        tl.store(sel_ptr + row * 6 + 3, rkept)
        tl.store(sel_ptr + row * 6 + 4, rcount)


@triton.jit
def _gather_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, P, sel_ptr, off_ptr,
    roff_ptr, rnext_ptr, cand_ptr, cidx_ptr, rcand_ptr, ridx_ptr, below_ptr, span_ptr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, PMAX: tl.constexpr, CAP: tl.constexpr, RCAP: tl.constexpr,
    TOPK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    part = tl.program_id(1)
    prow = p_ptr + row * _NF
    top_raw, top = _row_tops(stat_ptr, row, P, PMAX)
    key_top = _key(top)
    key_raw = _key(top_raw)
    cut = tl.load(sel_ptr + row * 6 + 0)
    pos = tl.load(off_ptr + row * P + part)
    rcut = tl.load(sel_ptr + row * 6 + 2)
    rkept = tl.load(sel_ptr + row * 6 + 3)
    rpos = tl.load(roff_ptr + row * P + part)
    npos = rkept + tl.load(rnext_ptr + row * P + part)
    below = tl.full([BLOCK], float("-inf"), tl.float32)
    lo = tl.full([BLOCK], 0xFFFFFFFF, tl.uint64)
    hi = tl.zeros([BLOCK], tl.uint64)
    for i in range(0, CHUNK, BLOCK):
        cols = part * CHUNK + i + tl.arange(0, BLOCK)
        inb, x, s = _scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
        mine = inb & (_bucket(key_top - _key(s)) <= cut)
        at = pos + tl.cumsum(mine.to(tl.int32), 0) - 1
        tl.store(cand_ptr + row * CAP + at, s, mask=mine)
        tl.store(cidx_ptr + row * CAP + at, cols, mask=mine)
        pos += tl.sum(mine.to(tl.int32), 0)
        below = tl.maximum(below, tl.where(inb & ~mine, s, float("-inf")))
        if TOPK:
            kx = _key(x)
            bx = _bucket(key_raw - kx)
            mine = inb & (bx <= rcut)
            at = rpos + tl.cumsum(mine.to(tl.int32), 0) - 1
            tl.store(rcand_ptr + row * RCAP + at, x, mask=mine)
            tl.store(ridx_ptr + row * RCAP + at, cols, mask=mine)
            rpos += tl.sum(mine.to(tl.int32), 0)
            # The next bucket's first members, in token order, fill the rest of the list.
            nxt = inb & (bx == rcut + 1)
            at = npos + tl.cumsum(nxt.to(tl.int32), 0) - 1
            tl.store(rcand_ptr + row * RCAP + at, x, mask=nxt & (at < RCAP))
            tl.store(ridx_ptr + row * RCAP + at, cols, mask=nxt & (at < RCAP))
            npos += tl.sum(nxt.to(tl.int32), 0)
            lo = tl.minimum(lo, tl.where(nxt, kx, 0xFFFFFFFF))
            hi = tl.maximum(hi, tl.where(nxt, kx, 0))
    tl.store(below_ptr + row * P + part, tl.max(below, 0))
    if TOPK:
        tl.store(span_ptr + (row * P + part) * 2 + 0, tl.min(lo, 0).to(tl.int64))
        tl.store(span_ptr + (row * P + part) * 2 + 1, tl.max(hi, 0).to(tl.int64))


# --- the slow path: whole-row passes inside the final kernel ------------------------------------------


@triton.jit
def _above_pass(
    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, piv,
    RAW: tl.constexpr, BLOCK: tl.constexpr, NPIV: tl.constexpr,
):  # fmt: skip
    """How many tokens, and how much mass, come before each pivot of the order (uint64 [NPIV]).
    (Called with a quarter of the passes' block: [BLOCK, NPIV] accumulators stay in registers.)"""
    f = tl.zeros([BLOCK, NPIV], tl.int32)
    g = tl.zeros([BLOCK, NPIV], tl.int64)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inb, x, s = _scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
        v = x if RAW else s
        c = _order(_key(v), cols)
        hit = inb[:, None] & (c[:, None] > piv[None, :])
        f += hit.to(tl.int32)
        g += tl.where(hit, _mass(s, top)[:, None], 0)
    return tl.sum(f, 0), tl.sum(g, 0)


@triton.jit
def _search(
    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, k,
    RAW: tl.constexpr, BLOCK: tl.constexpr, NPIV: tl.constexpr,
):  # fmt: skip
    """The order position (uint64) of the k-th token: the smallest u with fewer than k above it."""
    lo = tl.zeros([], tl.uint64)  # k or more above
    hi = tl.full([], 0xFFFFFFFFFFFFFFFF, tl.uint64)  # fewer than k above
    j = tl.arange(0, NPIV).to(tl.uint64)
    while hi - lo > 1:
        step = tl.maximum((hi - lo) // (NPIV + 1), 1)
        piv = tl.minimum(lo + step * (j + 1), hi - 1)
        f, _ = _above_pass(
            row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, piv, RAW, BLOCK // 4,
            NPIV,
        )  # fmt: skip
        lo = tl.maximum(lo, tl.max(tl.where(f >= k, piv, 0), 0))
        hi = tl.minimum(hi, tl.min(tl.where(f < k, piv, 0xFFFFFFFFFFFFFFFF), 0))
    return hi


@triton.jit
def _reject_pass(
    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, min_q, seed, counter,
    cj, mid, BLOCK: tl.constexpr,
):  # fmt: skip
    """Tokens and mass before `cj` and before `mid`, and the Gumbel argmax of the min_p-kept tokens
    before each (their order position and index)."""
    fj = tl.zeros([BLOCK], tl.int32)
    gj = tl.zeros([BLOCK], tl.int64)
    fm = tl.zeros([BLOCK], tl.int32)
    gm = tl.zeros([BLOCK], tl.int64)
    zj = tl.full([BLOCK], float("-inf"), tl.float32)
    ij = tl.full([BLOCK], 2147483647, tl.int32)
    zm = tl.full([BLOCK], float("-inf"), tl.float32)
    im = tl.full([BLOCK], 2147483647, tl.int32)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inb, _x, s = _scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
        c = _order(_key(s), cols)
        q = _mass(s, top)
        z = tl.where(q.to(tl.float64) >= min_q, s + _gumbel(seed, counter, cols), float("-inf"))
        a = inb & (c > cj)
        fj += a.to(tl.int32)
        gj += tl.where(a, q, 0)
        better = a & (z > zj)
        ij = tl.where(better, cols, ij)
        zj = tl.where(better, z, zj)
        a = inb & (c > mid)
        fm += a.to(tl.int32)
        gm += tl.where(a, q, 0)
        better = a & (z > zm)
        im = tl.where(better, cols, im)
        zm = tl.where(better, z, zm)
    best_j = tl.max(zj, 0)
    best_m = tl.max(zm, 0)
    ij = tl.min(tl.where(zj == best_j, ij, 2147483647), 0)
    im = tl.min(tl.where(zm == best_m, im, 2147483647), 0)
    return tl.sum(fj, 0), tl.sum(gj, 0), ij, tl.sum(fm, 0), tl.sum(gm, 0), im


@triton.jit
def _order_of(row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, idx):
    cols = tl.full([1], 0, tl.int32) + idx
    _inb, _x, s = _scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
    return tl.max(_order(_key(s), cols), 0)


@triton.jit
def _draw_slow(
    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, first, k, big_p,
    min_q, seed, counter, BLOCK: tl.constexpr,
):  # fmt: skip
    """The exact draw over the whole row. The candidate, the Gumbel argmax of the min_p-kept tokens
    after `lo` in the order, is the answer once few and light enough tokens come before it; else it
    and all after it are out, and the next candidate comes from the same pass. Each pass also tests
    the middle of the undecided range (lo, hi], so the range halves at every pass."""
    lo = tl.zeros([], tl.uint64)  # tokens at or after lo in the order (c <= lo) are out
    hi = (
        _order_of(row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, first) - 1
    )  # tokens before hi (c > hi) are in: the top token
    _, _, cand, _, _, _ = _reject_pass(
        row,
        V,
        logits_ptr,
        stride_l,
        prow,
        ent_ptr,
        stride_e,
        bits_ptr,
        stride_b,
        top,
        min_q,
        seed,
        counter,
        lo,
        lo,
        BLOCK,
    )
    done = lo != lo  # a block-typed False: the loop carries it
    while not done:
        at = _order_of(row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, cand)
        mid = lo + (hi - lo) // 2
        fj, gj, after_cand, fm, gm, after_mid = _reject_pass(
            row,
            V,
            logits_ptr,
            stride_l,
            prow,
            ent_ptr,
            stride_e,
            bits_ptr,
            stride_b,
            top,
            min_q,
            seed,
            counter,
            at,
            mid,
            BLOCK,
        )
        done = (fj == 0) | ((fj < k) & (gj.to(tl.float64) < big_p))
        if not done:
            lo = at
            cand = after_cand
            mid_out = (fm >= k) | (gm.to(tl.float64) >= big_p)
            if mid_out:
                if mid > lo:
                    lo = mid
                    cand = after_mid
            else:
                hi = tl.minimum(hi, mid)
            hi = tl.maximum(hi, lo)
    return cand


@triton.jit
def _final_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, sidx_ptr,
    zpart_ptr, P, sel_ptr, cand_ptr, cidx_ptr, rcand_ptr, ridx_ptr, below_ptr, span_ptr,
    tok_ptr, lp_ptr, top_ids_ptr, top_lp_ptr,
    BLOCK: tl.constexpr, PMAX: tl.constexpr, CAP: tl.constexpr, RCAP: tl.constexpr, TOPK: tl.constexpr,
    NPIV: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    prow = p_ptr + row * _NF
    p = tl.arange(0, PMAX)
    pm = p < P
    stats = stat_ptr + (row * P + p) * 3
    part_raw = tl.load(stats + 0, mask=pm, other=float("-inf"))
    top_raw = tl.max(part_raw, 0)
    raw_sum = tl.sum(
        tl.where(pm, tl.load(stats + 1, mask=pm, other=0.0) * tl.exp(part_raw - top_raw), 0.0), 0
    )
    lse = top_raw + tl.log(raw_sum)
    part_top = tl.load(stats + 2, mask=pm, other=float("-inf"))
    top = tl.max(part_top, 0)
    first = tl.min(
        tl.where(pm & (part_top == top), tl.load(sidx_ptr + row * P + p, mask=pm, other=0), 2147483647), 0
    )
    first = tl.where(first < V, first, 0)
    total = tl.sum(tl.load(zpart_ptr + row * P + p, mask=pm, other=0), 0)
    temp = _f(prow, 0)
    top_p = _f(prow, 1).to(tl.float64)
    min_q = _f(prow, 2).to(tl.float64) * 4294967296.0
    k = _i(prow, 6)
    seed = _i(prow, 7)
    counter = _i(prow, 8)
    slot = _i(prow, 9)
    k_on = (k > 0) & (k < V)
    k = tl.where(k_on, k, V + 1).to(tl.int32)
    p_on = top_p < 1.0
    token = first
    if temp > 0:
        n = tl.load(sel_ptr + row * 6 + 1)
        j = tl.arange(0, CAP)
        valid = j < n
        v = tl.load(cand_ptr + row * CAP + j, mask=valid, other=float("-inf"))
        idx = tl.load(cidx_ptr + row * CAP + j, mask=valid, other=0)
        c = tl.sort(tl.where(valid, _order(_key(v), idx), 0), descending=True)
        idx = (4294967295 - (c & 0xFFFFFFFF)).to(tl.int32)
        v = tl.where(valid, _unkey(c >> 32), float("-inf"))
        q = _mass(v, top)
        before = tl.cumsum(q, 0) - q
        mass = tl.sum(q, 0)
        # The top-k mass is exact when the candidates hold the top k; else it lies in [mass, total].
        z_lo = tl.where(k_on, tl.where(k <= n, tl.sum(tl.where(j < k, q, 0), 0), mass), total).to(tl.float64)
        z_hi = tl.where(k_on & (k > n), total, z_lo.to(tl.int64)).to(tl.float64)
        b = before.to(tl.float64)
        # (Scalar-with-block logic is spelled as blocks: Triton's interpreter refuses the mix.)
        p_off = (b * 0.0 + top_p) >= 1.0
        sure_in = p_off | (b < top_p * z_lo)
        sure_out = ~p_off & (b >= top_p * z_hi)
        in_k = j < k
        in_m = q.to(tl.float64) >= min_q
        kept = valid & ((in_k & sure_in & in_m) | (j == 0))
        unsure = valid & (j != 0) & in_k & in_m & ~sure_in & ~sure_out
        # The best token left out stands next in the order: it must not be kept.
        below = tl.max(tl.load(below_ptr + row * P + p, mask=pm, other=float("-inf")), 0)
        q_below = _mass(below, top).to(tl.float64)
        out = (n >= V) | (n >= k) | (p_on & (mass.to(tl.float64) >= top_p * z_hi)) | (q_below < min_q)
        if (n > 0) & (tl.max(unsure.to(tl.int32), 0) == 0) & out:
            z = tl.where(kept, v + _gumbel(seed, counter, idx), float("-inf"))
            best = tl.max(z, 0)
            token = tl.min(tl.where(kept & (z == best), idx, 2147483647), 0)
            tl.store(sel_ptr + row * 6 + 5, 1)
        else:
            big_p = tl.where(p_on, top_p * z_lo, 1e300)
            if p_on & k_on & (k > n):
                at = _search(
                    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, k,
                    False, BLOCK, NPIV,
                )  # fmt: skip
                _, g = _above_pass(
                    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top,
                    tl.full([NPIV], 0, tl.uint64) + (at - 1), False, BLOCK // 4, NPIV,
                )  # fmt: skip
                big_p = top_p * tl.max(g, 0).to(tl.float64)
            tl.store(sel_ptr + row * 6 + 5, 2)
            token = _draw_slow(
                row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, first, k, big_p,
                min_q, seed, counter, BLOCK,
            )  # fmt: skip
    tl.store(tok_ptr + row, token.to(tl.int64))
    raw = tl.load(logits_ptr + row.to(tl.int64) * stride_l + token).to(tl.float32)
    tl.store(lp_ptr + row, raw - lse)
    if TOPK > 0:
        _top_logprobs(
            row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top_raw, lse, P, sel_ptr,
            rcand_ptr, ridx_ptr, span_ptr, top_ids_ptr, top_lp_ptr, BLOCK, PMAX, RCAP, TOPK, NPIV,
        )  # fmt: skip
    if slot != 0:
        entry = ent_ptr + slot * stride_e + token
        tl.store(entry, tl.load(entry) + 1)
        word = bits_ptr + slot * stride_b + (token >> 5)
        tl.store(word, tl.load(word) | (tl.full([], 1, tl.int32) << (token & 31).to(tl.int32)))


@triton.jit
def _top_logprobs(
    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top_raw, lse, P, sel_ptr,
    rcand_ptr, ridx_ptr, span_ptr, top_ids_ptr, top_lp_ptr,
    BLOCK: tl.constexpr, PMAX: tl.constexpr, RCAP: tl.constexpr, TOPK: tl.constexpr, NPIV: tl.constexpr,
):  # fmt: skip
    """The TOPK largest raw logits (ties: lowest index first) as logprobs."""
    p = tl.arange(0, PMAX)
    pm = p < P
    n = tl.load(sel_ptr + row * 6 + 3)
    count = tl.load(sel_ptr + row * 6 + 4)
    lo = tl.min(tl.load(span_ptr + (row * P + p) * 2 + 0, mask=pm, other=0xFFFFFFFF), 0)
    hi = tl.max(tl.load(span_ptr + (row * P + p) * 2 + 1, mask=pm, other=0), 0)
    # Ties in the next bucket are ordered by index, and its first members are in the list.
    use = tl.where(n >= TOPK, n, n + tl.minimum(count, RCAP - n))
    if (n < TOPK) & ((lo != hi) | (n + count < TOPK)):
        tl.store(sel_ptr + row * 6 + 5, tl.load(sel_ptr + row * 6 + 5) + 4)
        at = _search(
            row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top_raw, TOPK,
            True, BLOCK, NPIV,
        )  # fmt: skip
        pos = n * 0
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inb, x, _s = _scores(
                row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b
            )
            mine = inb & (_order(_key(x), cols) >= at)
            where = pos + tl.cumsum(mine.to(tl.int32), 0) - 1
            tl.store(rcand_ptr + row * RCAP + where, x, mask=mine)
            tl.store(ridx_ptr + row * RCAP + where, cols, mask=mine)
            pos += tl.sum(mine.to(tl.int32), 0)
        use = n * 0 + TOPK
        tl.debug_barrier()
    j = tl.arange(0, RCAP)
    valid = j < use
    x = tl.load(rcand_ptr + row * RCAP + j, mask=valid, other=float("-inf"))
    idx = tl.load(ridx_ptr + row * RCAP + j, mask=valid, other=0)
    c = tl.sort(tl.where(valid, _order(_key(x), idx), 0), descending=True)
    idx = (4294967295 - (c & 0xFFFFFFFF)).to(tl.int64)
    x = _unkey(c >> 32)
    tl.store(top_ids_ptr + row * TOPK + j, idx, mask=j < TOPK)
    tl.store(top_lp_ptr + row * TOPK + j, x - lse, mask=j < TOPK)


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def sample(logits, p, entries, bits, num_top: int, chunk: int = CHUNK, block: int = BLOCK, paths=None):
    """(tokens, logprobs, top_ids | None, top_logprobs | None) of logits [B, V]: sampling.py's
    definition, and each token counted in its row's slot of the penalty table.

    `paths` [B] int32, if given, says how each row was decided (for tests and profiling): 0 greedy,
    1 from its candidates, 2 by the slow path; plus 4 when its top-k logprobs took the slow path.
    """
    rows, vocab = logits.shape
    if num_top > vocab:
        raise ValueError(f"top-{num_top} logprobs of a vocabulary of {vocab}")
    dev = logits.device
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    parts = -(-vocab // chunk)
    pmax = _pow2(parts)
    params = p.data.contiguous()
    if params.shape[1] != NFIELDS:
        raise ValueError(f"sampling parameters have {params.shape[1]} fields; the kernels read {NFIELDS}")
    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    stats = torch.empty(rows, parts, 3, dtype=f32, device=dev)
    sidx = torch.empty(rows, parts, dtype=i32, device=dev)
    hist = torch.empty(rows, parts, BUCKETS, dtype=i32, device=dev)
    rhist = torch.empty(rows, parts, BUCKETS, dtype=i32, device=dev) if num_top else hist
    zpart = torch.empty(rows, parts, dtype=i64, device=dev)
    sel = torch.zeros(rows, 6, dtype=i32, device=dev)
    off, roff, rnext = (torch.zeros(rows, parts, dtype=i32, device=dev) for _ in range(3))
    cand = torch.empty(rows, CANDIDATES, dtype=f32, device=dev)
    cidx = torch.empty(rows, CANDIDATES, dtype=i32, device=dev)
    rcand = torch.empty(rows, RAW_CANDIDATES, dtype=f32, device=dev)
    ridx = torch.empty(rows, RAW_CANDIDATES, dtype=i32, device=dev)
    below = torch.empty(rows, parts, dtype=f32, device=dev)
    span = torch.empty(rows, parts, 2, dtype=i64, device=dev) if num_top else zpart
    tokens = torch.empty(rows, dtype=i64, device=dev)
    logprobs = torch.empty(rows, dtype=f32, device=dev)
    top_ids = torch.empty(rows, max(num_top, 1), dtype=i64, device=dev)
    top_lp = torch.empty(rows, max(num_top, 1), dtype=f32, device=dev)
    row_args = (logits, logits.stride(0), vocab, params, entries, entries.stride(0), bits, bits.stride(0))
    grid = (rows, parts)
    exact = dict(enable_fp_fusion=False)  # no FMA: penalties round as the torch definition does
    _stats_kernel[grid](*row_args, stats, sidx, parts, CHUNK=chunk, BLOCK=block, **exact)
    _hist_kernel[grid](
        *row_args, stats, parts, hist, rhist, zpart, CHUNK=chunk, BLOCK=block, PMAX=pmax, NB=BUCKETS,
        TOPK=num_top, **exact,
    )  # fmt: skip
    _select_kernel[(rows,)](
        hist, rhist, parts, sel, off, roff, rnext, CAP=CANDIDATES, RCAP=RAW_CANDIDATES, PMAX=pmax, NB=BUCKETS,
        TOPK=num_top,
    )  # fmt: skip
    _gather_kernel[grid](
        *row_args, stats, parts, sel, off, roff, rnext, cand, cidx, rcand, ridx, below, span, CHUNK=chunk,
        BLOCK=block, PMAX=pmax, CAP=CANDIDATES, RCAP=RAW_CANDIDATES, TOPK=num_top, **exact,
    )  # fmt: skip
    _final_kernel[(rows,)](
        logits, logits.stride(0), vocab, params, entries, entries.stride(0), bits, bits.stride(0),
        stats, sidx, zpart, parts, sel, cand, cidx, rcand, ridx, below, span, tokens, logprobs, top_ids, top_lp,
        BLOCK=block, PMAX=pmax, CAP=CANDIDATES, RCAP=RAW_CANDIDATES, TOPK=num_top, NPIV=PIVOTS, **exact,
    )  # fmt: skip
    if paths is not None:
        paths.copy_(sel[:, 5])
    if not num_top:
        return tokens, logprobs, None, None
    return tokens, logprobs, top_ids, top_lp
