"""The row-parallel passes of the fused sampler (sampling_triton.py): programs of CHUNK logits."""

from __future__ import annotations

import triton
import triton.language as tl

from .sampling_jit import (
    NF,
    SEL,
    bucket,
    bucket_floor,
    distance,
    fixed_mass,
    fixed_mass_float,
    float_field,
    float_key,
    gumbel,
    int_field,
    order_key,
    row_terms,
    scores_of,
    signed_key,
)
from .triton_kernels import _release, _wait


@triton.jit
def stats_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, sidx_ptr, gmax_ptr, P,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    """Per chunk: the raw logits' max, the scores' max and first argmax, and the maxima of GROUPS
    disjoint sets of the chunk's scores (and raw logits), for `floor_kernel`. (The raw exp-sum waits
    for list_kernel, which knows the row's top: one exp per logit there, not two here.)"""
    row = tl.program_id(0)
    part = tl.program_id(1)
    prow = p_ptr + row * NF
    inv_t, rep, pres, freq, slot, ban = row_terms(prow)
    rmax = tl.full([BLOCK], float("-inf"), tl.float32)
    smax = tl.full([BLOCK], float("-inf"), tl.float32)
    sidx = tl.full([BLOCK], 2147483647, tl.int32)
    for i in range(0, CHUNK, BLOCK):
        cols = part * CHUNK + i + tl.arange(0, BLOCK)
        _inb, x, s = scores_of(
            row, cols, V, logits_ptr, stride_l, inv_t, rep, pres, freq, slot, ban, ent_ptr, stride_e, bits_ptr, stride_b,
        )  # fmt: skip
        rmax = tl.maximum(rmax, x)
        better = s > smax
        sidx = tl.where(better, cols, sidx)
        smax = tl.where(better, s, smax)
    top = tl.max(smax, 0)
    first = tl.min(tl.where(smax == top, sidx, 2147483647), 0)
    out = stat_ptr + (row * P + part) * 3
    tl.store(out + 0, tl.max(rmax, 0))
    tl.store(out + 2, top)
    tl.store(sidx_ptr + row * P + part, first)
    # A lane's running max covers its own columns, so lanes in groups are disjoint sets of tokens.
    g = tl.arange(0, GROUPS)
    at = gmax_ptr + (row * P + part) * 2 * GROUPS + g
    tl.store(at, tl.max(tl.reshape(smax, [GROUPS, BLOCK // GROUPS]), 1))
    tl.store(at + GROUPS, tl.max(tl.reshape(rmax, [GROUPS, BLOCK // GROUPS]), 1))


@triton.jit
def _kth_largest(ptr, P, k, PMAX: tl.constexpr, GROUPS: tl.constexpr):
    """The k-th largest (from 0) of a row's P * GROUPS group maxima (-inf when there are fewer)."""
    f = tl.arange(0, PMAX * GROUPS)
    part = f // GROUPS
    v = tl.load(ptr + part * 2 * GROUPS + f % GROUPS, mask=part < P, other=float("-inf"))
    v = tl.sort(v, descending=True)
    return tl.max(tl.where(f == k, v, float("-inf")), 0)


@triton.jit
def floor_kernel(
    gmax_ptr, floor_ptr, lfill_ptr, P,
    PMAX: tl.constexpr, GROUPS: tl.constexpr, CAP: tl.constexpr, RCAP: tl.constexpr, TOPK: tl.constexpr,
    LCAP: tl.constexpr, RLCAP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """Per row: the (CAP + 1)-th largest of the chunks' group maxima of the scores, and the
    (RCAP + 1)-th of the raw logits'. Each of those groups holds a token at or above it, so more
    than the cap do; and few tokens lie above it (about 170 of a random 128k row, against 2500
    above the least group maximum). Zeroes the row's list counts for list_kernel, or marks the raw
    list full from the start where its floor is -inf: every raw logit, -inf ones too, lies at or above
    it, and listing them would be an atomic add per token. The score list lists only finite scores, so
    a -inf floor there (a grammar or an allow-list that leaves few tokens) keeps it."""
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    base = gmax_ptr + row * P * 2 * GROUPS
    low = _kth_largest(base, P, CAP, PMAX, GROUPS)
    tl.store(floor_ptr + row * 2 + 0, low)
    rlow = tl.full([], float("-inf"), tl.float32)
    if TOPK:
        rlow = _kth_largest(base + GROUPS, P, RCAP, PMAX, GROUPS)
    tl.store(floor_ptr + row * 2 + 1, rlow)
    # A -inf score floor (a grammar or an allow-list that leaves few tokens): list_kernel lists the
    # finite scores; only more than LCAP of them make the list overflow, as a finite floor's ties do.
    tl.store(lfill_ptr + row * 2 + 0, 0)
    tl.store(lfill_ptr + row * 2 + 1, tl.where((rlow > float("-inf")) | (TOPK == 0), 0, RLCAP + 1))


@triton.jit
def _row_tops(stat_ptr, row, P, PMAX: tl.constexpr):
    p = tl.arange(0, PMAX)
    base = stat_ptr + (row * P + p) * 3
    top_raw = tl.max(tl.load(base + 0, mask=p < P, other=float("-inf")), 0)
    top = tl.max(tl.load(base + 2, mask=p < P, other=float("-inf")), 0)
    return top_raw, top


@triton.jit
def _count(hist, at, last, inb):
    """Counts the block's tokens of buckets before `last` into `hist`; returns, per lane, whether its
    token falls in `last` (summed in registers by the caller)."""
    tl.atomic_add(hist + at, 1, mask=inb & (at < last), sem="relaxed")
    return (inb & (at == last)).to(tl.int32)


@triton.jit
def _overflows(lfill_ptr, row, LCAP: tl.constexpr, RLCAP: tl.constexpr, TOPK: tl.constexpr):
    """Whether a row's lists (list_kernel's) missed tokens above its floors."""
    over = tl.load(lfill_ptr + row * 2 + 0) > LCAP
    if TOPK:
        over = over | (tl.load(lfill_ptr + row * 2 + 1) > RLCAP)
    return over


@triton.jit
def list_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, floor_ptr, P, zpart_ptr,
    cand_ptr, cidx_ptr, rcand_ptr, ridx_ptr, lfill_ptr, below_ptr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, PMAX: tl.constexpr, TOPK: tl.constexpr, LCAP: tl.constexpr,
    RLCAP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """Per chunk: the raw logits' exp-sum below the row's top raw logit, the total mass, the best
    score below the row's floor, and the tokens at or above its floors (`floor_kernel`) appended to
    the row's candidate lists (up to LCAP and RLCAP, the rest only counted). Those are the row's top
    tokens, more than the caps: decide_kernel and the top-k logprobs take them as they are, with no
    histogram and no second pass over the row."""
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    inv_t, rep, pres, freq, slot, ban = row_terms(p_ptr + row * NF)
    top_raw, top = _row_tops(stat_ptr, row, P, PMAX)
    low = tl.load(floor_ptr + row * 2 + 0)
    rlow = tl.load(floor_ptr + row * 2 + 1)
    # A -inf raw floor: floor_kernel marked the raw list full (every token reaches it). A -inf score
    # floor lists the finite scores instead (below), so an allow-list row's candidates need no
    # histogram or gather pass (a row whose draw spans the whole row still reads it to draw).
    rfull = (rlow == float("-inf")) | (TOPK == 0)
    full = low != low  # False (a NaN floor aside), until this program finds the list past its end
    low = signed_key(low)
    rlow = signed_key(rlow)
    # The mass in fp64: each term is an integer up to 2**32, so sums below 2**53 are exact in any
    # order, as in int64, without a 64-bit conversion and add per logit.
    z = tl.zeros([BLOCK], tl.float64)
    r = tl.zeros([BLOCK], tl.float32)
    below = tl.full([BLOCK], float("-inf"), tl.float32)
    for i in range(0, CHUNK, BLOCK):
        cols = part * CHUNK + i + tl.arange(0, BLOCK)
        inb, x, s = scores_of(
            row, cols, V, logits_ptr, stride_l, inv_t, rep, pres, freq, slot, ban, ent_ptr, stride_e, bits_ptr, stride_b,
        )  # fmt: skip
        z += fixed_mass_float(s, top).to(tl.float64)
        r += tl.where(x == float("-inf"), 0.0, tl.exp(x - top_raw))  # a NaN logit stays NaN, as in torch
        above = inb & (signed_key(s) >= low) & (s != float("-inf"))  # a NaN stays as before
        below = tl.maximum(below, tl.where(inb & ~above, s, float("-inf")))
        rabove = inb & (signed_key(x) >= rlow)
        # One check for both lists: most blocks append to neither. A program that found a list
        # past its end (many ties at the floor) appends no more to it: the count says enough.
        keep = tl.where(full, False, above)
        rkeep = tl.where(rfull, False, rabove)
        if tl.max((keep | rkeep).to(tl.int32), 0) > 0:
            at = _append(
                cand_ptr + row * LCAP, cidx_ptr + row * LCAP, lfill_ptr + row * 2, s, cols, keep, LCAP
            )
            full = full | (at >= LCAP)
            if TOPK:
                at = _append(
                    rcand_ptr + row * RLCAP, ridx_ptr + row * RLCAP, lfill_ptr + row * 2 + 1, x, cols, rkeep, RLCAP,
                )  # fmt: skip
                rfull = rfull | (at >= RLCAP)
    tl.store(stat_ptr + (row * P + part) * 3 + 1, tl.sum(r, 0))
    tl.store(zpart_ptr + row * P + part, tl.sum(z, 0).to(tl.int64))
    tl.store(below_ptr + row * P + part, tl.max(below, 0))


@triton.jit
def hist_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, floor_ptr, P, hist_ptr,
    rhist_ptr, lfill_ptr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, PMAX: tl.constexpr, NB: tl.constexpr, TOPK: tl.constexpr,
    LCAP: tl.constexpr, RLCAP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """For rows whose lists overflowed, per chunk: the histograms select_kernel cuts. Only buckets up
    to the cut's next one must be exact. More than the cap of tokens lie at or above the row's floor,
    so no cut reaches past its bucket: tokens below it are not counted. Counting is a relaxed atomic
    add into the chunk's own global histogram, so a block pays only for the few tokens it counts.
    (tl.histogram pays per call: it zeroes, syncs and reads back all its bins; this pass took 99 us
    with it at batch 64 on an H200, 60 us without.)"""
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    if _overflows(lfill_ptr, row, LCAP, RLCAP, TOPK):
        inv_t, rep, pres, freq, slot, ban = row_terms(p_ptr + row * NF)
        top_raw, top = _row_tops(stat_ptr, row, P, PMAX)
        key_top = signed_key(top)
        key_raw = signed_key(top_raw)
        last, rlast = _lasts(floor_ptr, row, key_top, key_raw)
        b = tl.arange(0, NB)
        mine = hist_ptr + (row * P + part) * NB
        rmine = rhist_ptr + (row * P + part) * NB
        tl.store(mine + b, tl.zeros([NB], tl.int32))
        if TOPK:
            tl.store(rmine + b, tl.zeros([NB], tl.int32))
        tl.debug_barrier()  # the zeros land before any thread of the program counts
        # The last counted bucket is the crowded one (all of a grammar-masked row's -inf tokens): its
        # count is summed in registers and added once, not by an atomic per token on one address.
        at_last = tl.zeros([BLOCK], tl.int32)
        rat_last = tl.zeros([BLOCK], tl.int32)
        for i in range(0, CHUNK, BLOCK):
            cols = part * CHUNK + i + tl.arange(0, BLOCK)
            inb, x, s = scores_of(
                row, cols, V, logits_ptr, stride_l, inv_t, rep, pres, freq, slot, ban, ent_ptr, stride_e, bits_ptr, stride_b,
            )  # fmt: skip
            at_last += _count(mine, bucket(distance(key_top, signed_key(s))), last, inb)
            if TOPK:
                rat_last += _count(rmine, bucket(distance(key_raw, signed_key(x))), rlast, inb)
        tl.atomic_add(mine + last, tl.sum(at_last, 0), mask=last < NB, sem="relaxed")
        if TOPK:
            tl.atomic_add(rmine + rlast, tl.sum(rat_last, 0), mask=rlast < NB, sem="relaxed")


@triton.jit
def _lasts(floor_ptr, row, key_top, key_raw):
    """The buckets of the row's floors (`floor_kernel`): the last ones hist_kernel counts. Every
    token lies in them or before them when a floor is -inf (as it is when a row has too few groups)."""
    last = bucket(distance(key_top, signed_key(tl.load(floor_ptr + row * 2 + 0))))
    rlast = bucket(distance(key_raw, signed_key(tl.load(floor_ptr + row * 2 + 1))))
    return last, rlast


@triton.jit
def _cut(hist_ptr, row, P, cap, PMAX: tl.constexpr, NB: tl.constexpr):
    """The deepest bucket whose cumulative count stays within `cap` (-1: none), the count it
    keeps, each chunk's offset of the next bucket's members (filled in token order), and that
    bucket's count."""
    p = tl.arange(0, PMAX)
    b = tl.arange(0, NB)
    h = tl.load(hist_ptr + (row * P + p[:, None]) * NB + b[None, :], mask=(p < P)[:, None], other=0)
    total = tl.sum(h, 0)
    cum = tl.cumsum(total, 0)
    cut = tl.max(tl.where(cum <= cap, b, -1), 0)
    kept = tl.sum(tl.where(b <= cut, total, 0), 0)
    nxt = tl.sum(tl.where(b[None, :] == cut + 1, h, 0), 1)
    return cut, kept, tl.cumsum(nxt, 0) - nxt, tl.sum(nxt, 0)


@triton.jit
def select_kernel(
    hist_ptr, rhist_ptr, P, sel_ptr, fill_ptr, rnext_ptr, lfill_ptr,
    CAP: tl.constexpr, RCAP: tl.constexpr, PMAX: tl.constexpr, NB: tl.constexpr, TOPK: tl.constexpr,
    LCAP: tl.constexpr, RLCAP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """A row's candidates: its lists as they are, or where they overflowed, the deepest bucket that
    keeps them within their cap (sel[:, 6] says which, for gather_kernel)."""
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    p = tl.arange(0, PMAX)
    over = _overflows(lfill_ptr, row, LCAP, RLCAP, TOPK)
    tl.store(sel_ptr + row * SEL + 6, over.to(tl.int32))
    tl.store(sel_ptr + row * SEL + 2, -1)
    tl.store(sel_ptr + row * SEL + 4, 0)
    if over:
        cut, kept, _, _ = _cut(hist_ptr, row, P, CAP, PMAX, NB)
        tl.store(sel_ptr + row * SEL + 0, cut)
        tl.store(sel_ptr + row * SEL + 1, kept)
        tl.store(sel_ptr + row * SEL + 3, 0)
        tl.store(fill_ptr + row * 2 + 0, 0)
        tl.store(fill_ptr + row * 2 + 1, 0)
        if TOPK:
            rcut, rkept, rnext, rcount = _cut(rhist_ptr, row, P, RCAP, PMAX, NB)
            tl.store(rnext_ptr + row * P + p, rnext, mask=p < P)
            tl.store(sel_ptr + row * SEL + 2, rcut)
            tl.store(sel_ptr + row * SEL + 3, rkept)
            tl.store(sel_ptr + row * SEL + 4, rcount)
    else:
        tl.store(sel_ptr + row * SEL + 0, -1)
        tl.store(sel_ptr + row * SEL + 1, tl.load(lfill_ptr + row * 2 + 0))
        tl.store(sel_ptr + row * SEL + 3, tl.load(lfill_ptr + row * 2 + 1))


@triton.jit
def _draws_beyond_candidates(prow, V, n):
    """Whether a row may keep tokens past its candidates: sampled, with no top-k they hold."""
    k = int_field(prow, 6)
    return (float_field(prow, 0) > 0) & ((k <= 0) | (k >= V) | (k > n))


@triton.jit
def _draw_above(
    row, part, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, after,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Over one chunk, the tokens after `after` in the order (uint64; 0: all): how many, their
    mass, and the Gumbel argmax (score, index) of those min_p keeps."""
    inv_t, rep, pres, freq, slot, ban = row_terms(prow)
    seed = int_field(prow, 7)
    counter = int_field(prow, 8)
    min_q = float_field(prow, 2).to(tl.float64) * 4294967296.0
    f = tl.zeros([BLOCK], tl.int32)
    g = tl.zeros([BLOCK], tl.int64)
    zb = tl.full([BLOCK], float("-inf"), tl.float32)
    ib = tl.full([BLOCK], 2147483647, tl.int32)
    for i in range(0, CHUNK, BLOCK):
        cols = part * CHUNK + i + tl.arange(0, BLOCK)
        inb, _x, s = scores_of(
            row, cols, V, logits_ptr, stride_l, inv_t, rep, pres, freq, slot, ban, ent_ptr, stride_e, bits_ptr, stride_b,
        )  # fmt: skip
        q = fixed_mass(s, top)
        mine = inb & (order_key(float_key(s), cols) > after)
        f += mine.to(tl.int32)
        g += tl.where(mine, q, 0)
        z = tl.where(mine & (q.to(tl.float64) >= min_q), s + gumbel(seed, counter, cols), float("-inf"))
        better = z > zb
        ib = tl.where(better, cols, ib)
        zb = tl.where(better, z, zb)
    best = tl.max(zb, 0)
    return tl.sum(f, 0), tl.sum(g, 0), best, tl.min(tl.where(zb == best, ib, 2147483647), 0)


@triton.jit
def draw_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, P, sel_ptr, dec_ptr,
    after_ptr, count_ptr, mass_ptr, best_ptr, idx_ptr, CHECK: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, PMAX: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """Per chunk, for rows that may keep tokens past their candidates: the Gumbel argmax of the
    min_p-kept tokens (a draw with no top-k or top-p is that argmax), or, with CHECK, for rows
    whose argmax `decide_kernel` must check, the tokens and mass before it and the argmax after it."""
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    prow = p_ptr + row * NF
    if CHECK:
        active = tl.load(dec_ptr + row * 2 + 1) == 3
        after = tl.load(after_ptr + row).to(tl.uint64)
    else:
        active = _draws_beyond_candidates(prow, V, tl.load(sel_ptr + row * SEL + 1))
        after = tl.zeros([], tl.uint64)
    f = tl.zeros([], tl.int32)
    g = tl.zeros([], tl.int64)
    best = tl.full([], float("-inf"), tl.float32)
    idx = tl.full([], 2147483647, tl.int32)
    if active:
        _top_raw, top = _row_tops(stat_ptr, row, P, PMAX)
        f, g, best, idx = _draw_above(
            row, part, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, after,
            CHUNK, BLOCK,
        )  # fmt: skip
    out = row * P + part
    tl.store(count_ptr + out, f)
    tl.store(mass_ptr + out, g)
    tl.store(best_ptr + out, best)
    tl.store(idx_ptr + out, idx)


@triton.jit
def _append(ptr, iptr, fill_ptr, v, cols, keep, cap):
    """Appends `v` and `cols` where `keep`, each at the slot an atomic add on the list's fill gives
    (past `cap` only counted); returns the last slot taken (-1: none). Relaxed: a slot only has to
    be unique (the default acq_rel fences every add)."""
    at = tl.atomic_add(fill_ptr + tl.zeros_like(cols), 1, mask=keep, sem="relaxed")
    tl.store(ptr + at, v, mask=keep & (at < cap))
    tl.store(iptr + at, cols, mask=keep & (at < cap))
    return tl.max(tl.where(keep, at, -1), 0)


@triton.jit
def _place(ptr, iptr, fill_ptr, v, cols, keep, cap):
    """`_append`, skipped by a block that keeps nothing (most do): the atomic's returned slot would
    stall the loop."""
    if tl.max(keep.to(tl.int32), 0) > 0:
        _append(ptr, iptr, fill_ptr, v, cols, keep, cap)


@triton.jit
def gather_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, P, sel_ptr, fill_ptr,
    rnext_ptr, cand_ptr, cidx_ptr, rcand_ptr, ridx_ptr, below_ptr, span_ptr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, PMAX: tl.constexpr, CAP: tl.constexpr, RCAP: tl.constexpr,
    TOPK: tl.constexpr, LCAP: tl.constexpr, RLCAP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """For rows whose lists overflowed: each chunk's candidates (bucket <= cut) into the row's list
    (rows LCAP and RLCAP apart, caps CAP and RCAP), and its best score left out. Buckets are a
    monotone function of a logit's key, so membership is one compare with the cut's lowest key; a
    chunk whose top (from stats_kernel) is below every list's lowest key reads nothing."""
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    lo_key = tl.full([], 2147483647, tl.int32)
    hi_key = tl.full([], -2147483648, tl.int32)
    if tl.load(sel_ptr + row * SEL + 6) != 0:
        inv_t, rep, pres, freq, slot, ban = row_terms(p_ptr + row * NF)
        top_raw, top = _row_tops(stat_ptr, row, P, PMAX)
        cut = tl.load(sel_ptr + row * SEL + 0)
        floor = bucket_floor(signed_key(top), cut)
        rcut = tl.load(sel_ptr + row * SEL + 2)
        rkept = tl.load(sel_ptr + row * SEL + 3)
        key_raw = signed_key(top_raw)
        rfloor = bucket_floor(key_raw, rcut)
        # The next bucket's members complete the top-k logprobs only when the list holds fewer than k.
        short = rkept < TOPK
        nfloor = tl.where(short, bucket_floor(key_raw, rcut + 1), 2147483647)
        chunk_top = tl.load(stat_ptr + (row * P + part) * 3 + 2)
        busy = (cut >= 0) & (signed_key(chunk_top) >= floor)
        if TOPK:
            lowest = tl.where(rcut >= 0, tl.minimum(rfloor, nfloor), nfloor)
            busy = busy | (signed_key(tl.load(stat_ptr + (row * P + part) * 3 + 0)) >= lowest)
        # A chunk with no members: the best score it leaves out is its top, and no next-bucket span.
        below_top = chunk_top
        if busy:
            npos = rkept + tl.load(rnext_ptr + row * P + part)
            below = tl.full([BLOCK], float("-inf"), tl.float32)
            lo = tl.full([BLOCK], 2147483647, tl.int32)
            hi = tl.full([BLOCK], -2147483648, tl.int32)
            for i in range(0, CHUNK, BLOCK):
                cols = part * CHUNK + i + tl.arange(0, BLOCK)
                inb, x, s = scores_of(
                    row, cols, V, logits_ptr, stride_l, inv_t, rep, pres, freq, slot, ban, ent_ptr, stride_e, bits_ptr, stride_b,
                )  # fmt: skip
                mine = tl.where(cut >= 0, inb & (signed_key(s) >= floor), False)
                below = tl.maximum(below, tl.where(inb & ~mine, s, float("-inf")))
                _place(cand_ptr + row * LCAP, cidx_ptr + row * LCAP, fill_ptr + row * 2, s, cols, mine, CAP)
                if TOPK:
                    kx = signed_key(x)
                    rmine = tl.where(rcut >= 0, inb & (kx >= rfloor), False)
                    _place(
                        rcand_ptr + row * RLCAP,
                        ridx_ptr + row * RLCAP,
                        fill_ptr + row * 2 + 1,
                        x,
                        cols,
                        rmine,
                        RCAP,
                    )
                    if short:
                        # The next bucket's first members, in token order, fill the rest of the list.
                        nxt = inb & (kx >= nfloor) & ~rmine
                        where = npos + tl.cumsum(nxt.to(tl.int32), 0) - 1
                        tl.store(rcand_ptr + row * RLCAP + where, x, mask=nxt & (where < RCAP))
                        tl.store(ridx_ptr + row * RLCAP + where, cols, mask=nxt & (where < RCAP))
                        npos += tl.sum(nxt.to(tl.int32), 0)
                        lo = tl.minimum(lo, tl.where(nxt, kx, 2147483647))
                        hi = tl.maximum(hi, tl.where(nxt, kx, -2147483648))
            below_top = tl.max(below, 0)
            lo_key = tl.min(lo, 0)
            hi_key = tl.max(hi, 0)
        tl.store(below_ptr + row * P + part, below_top)
    if TOPK:
        # As unsigned keys (float_key), and (0xFFFFFFFF, 0) for a chunk with none of the next bucket.
        lo_u = lo_key.to(tl.int64) + 2147483648
        hi_u = hi_key.to(tl.int64) + 2147483648
        none = hi_u < lo_u
        tl.store(span_ptr + (row * P + part) * 2 + 0, tl.where(none, 0xFFFFFFFF, lo_u))
        tl.store(span_ptr + (row * P + part) * 2 + 1, tl.where(none, 0, hi_u))
