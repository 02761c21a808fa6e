"""The fused sampler's per-row kernels (sampling_triton.py): `decide_kernel` draws from the
candidates, or takes draw_kernel's argmax of the whole row; `final_kernel` accepts that argmax once
checked, or runs the exact slow path from it, then the top-k logprobs and the penalty count."""

from __future__ import annotations

import triton
import triton.language as tl

from .sampling_jit import (
    NF,
    RANKS,
    SEL,
    fixed_mass,
    float_field,
    float_key,
    gumbel,
    int_field,
    key_float,
    order_key,
    scores,
)
from .triton_kernels import _release, _wait

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
        inb, x, s = scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
        v = x if RAW else s
        c = order_key(float_key(v), cols)
        hit = inb[:, None] & (c[:, None] > piv[None, :])
        f += hit.to(tl.int32)
        g += tl.where(hit, fixed_mass(s, top)[:, None], 0)
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
        inb, _x, s = scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
        c = order_key(float_key(s), cols)
        q = fixed_mass(s, top)
        z = tl.where(q.to(tl.float64) >= min_q, s + gumbel(seed, counter, cols), float("-inf"))
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
    _inb, _x, s = scores(row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b)
    return tl.max(order_key(float_key(s), cols), 0)


@triton.jit
def _draw_slow(
    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, first, k, big_p,
    min_q, seed, counter, lo, cand, BLOCK: tl.constexpr,
):  # fmt: skip
    """The exact draw over the whole row, a pass at a time. Tokens at or after `lo` in the order are
    out; `cand`, the Gumbel argmax of the min_p-kept tokens before it, is the answer once few and
    light enough tokens come before it; else it and all after it are out, and the next candidate
    comes from the same pass. Each pass also tests the middle of the undecided range (lo, hi], so
    the range halves at every pass."""
    hi = _order_of(row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, first) - 1
    hi = tl.maximum(hi, lo)
    done = lo != lo  # a block-typed False: the loop carries it
    while not done:
        at = _order_of(row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, cand)
        mid = lo + (hi - lo) // 2
        fj, gj, after_cand, fm, gm, after_mid = _reject_pass(
            row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, min_q, seed,
            counter, at, mid, BLOCK,
        )  # fmt: skip
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
def _row_stats(stat_ptr, sidx_ptr, zpart_ptr, row, P, V, PMAX: tl.constexpr):
    """The passes' per-chunk results merged: top raw logit, its log-sum-exp, top score, its first
    token, and the total mass."""
    p = tl.arange(0, PMAX)
    pm = p < P
    stats = stat_ptr + (row * P + p) * 3
    top_raw = tl.max(tl.load(stats + 0, mask=pm, other=float("-inf")), 0)
    raw_sum = tl.sum(tl.load(stats + 1, mask=pm, other=0.0), 0)  # list_kernel's, below top_raw
    part_top = tl.load(stats + 2, mask=pm, other=float("-inf"))
    top = tl.max(part_top, 0)
    firsts = tl.load(sidx_ptr + row * P + p, mask=pm, other=0)
    first = tl.min(tl.where(pm & (part_top == top), firsts, 2147483647), 0)
    total = tl.sum(tl.load(zpart_ptr + row * P + p, mask=pm, other=0), 0)
    return top_raw, top_raw + tl.log(raw_sum), top, tl.where(first < V, first, 0), total


@triton.jit
def _from_candidates(
    row, V, P, sel_ptr, cand_ptr, cidx_ptr, below_ptr, top, total, k, top_p, min_q, seed, counter,
    PMAX: tl.constexpr, CAP: tl.constexpr,
):  # fmt: skip
    """(decided, token, the top-k mass's lower bound, candidates): the draw when the candidates
    provably hold every kept token (sorted, they give each one's rank and the mass before it)."""
    n = tl.load(sel_ptr + row * SEL + 1)
    j = tl.arange(0, CAP)
    valid = j < n
    v = tl.load(cand_ptr + row * CAP + j, mask=valid, other=float("-inf"))
    idx = tl.load(cidx_ptr + row * CAP + j, mask=valid, other=0)
    c = tl.sort(tl.where(valid, order_key(float_key(v), idx), 0), descending=True)
    idx = (4294967295 - (c & 0xFFFFFFFF)).to(tl.int32)
    v = tl.where(valid, key_float(c >> 32), float("-inf"))
    q = fixed_mass(v, top)
    before = tl.cumsum(q, 0) - q
    mass = tl.sum(q, 0)
    # The top-k mass is exact when the candidates hold the top k; else it lies in [mass, total].
    k_on = k <= V
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
    p = tl.arange(0, PMAX)
    below = tl.max(tl.load(below_ptr + row * P + p, mask=p < P, other=float("-inf")), 0)
    q_below = fixed_mass(below, top).to(tl.float64)
    out = (n >= V) | (n >= k) | ((top_p < 1.0) & (mass.to(tl.float64) >= top_p * z_hi)) | (q_below < min_q)
    decided = (n > 0) & (tl.max(unsure.to(tl.int32), 0) == 0) & out
    z = tl.where(kept, v + gumbel(seed, counter, idx), float("-inf"))
    token = tl.min(tl.where(kept & (z == tl.max(z, 0)), idx, 2147483647), 0)
    return decided, token, z_lo, n


@triton.jit
def _merged_draw(best_ptr, idx_ptr, row, P, PMAX: tl.constexpr):
    """The Gumbel argmax over the row from draw_kernel's per-chunk results (first index on ties)."""
    p = tl.arange(0, PMAX)
    best = tl.load(best_ptr + row * P + p, mask=p < P, other=float("-inf"))
    idx = tl.load(idx_ptr + row * P + p, mask=p < P, other=2147483647)
    return tl.min(tl.where(best == tl.max(best, 0), idx, 2147483647), 0)


@triton.jit
def decide_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, sidx_ptr,
    zpart_ptr, P, sel_ptr, cand_ptr, cidx_ptr, below_ptr, best_ptr, idx_ptr, dec_ptr, big_p_ptr, after_ptr,
    BLOCK: tl.constexpr, PMAX: tl.constexpr, CAP: tl.constexpr, NPIV: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """A row's token when its candidates hold every kept token (state 1) or nothing limits the draw
    but min_p (state 2: draw_kernel's argmax); else (state 3) that argmax for draw_kernel to check,
    with the mass top-p allows before a kept token. State 0: greedy."""
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    prow = p_ptr + row * NF
    _top_raw, _lse, top, first, total = _row_stats(stat_ptr, sidx_ptr, zpart_ptr, row, P, V, PMAX)
    top_p = float_field(prow, 1).to(tl.float64)
    min_q = float_field(prow, 2).to(tl.float64) * 4294967296.0
    k = int_field(prow, 6)
    k = tl.where((k > 0) & (k < V), k, V + 1).to(tl.int32)  # V + 1: off
    token = first
    state = tl.zeros([], tl.int32)
    big_p = tl.full([], 1e300, tl.float64)
    # A row with no finite score (every token banned: an allow-list whose tokens its bad words or a
    # grammar ban) has nothing to draw: it takes the greedy token, the first (0), as the definition.
    if (float_field(prow, 0) > 0) & (top > float("-inf")):
        decided, token, z_lo, n = _from_candidates(
            row, V, P, sel_ptr, cand_ptr, cidx_ptr, below_ptr, top, total, k, top_p, min_q, int_field(prow, 7),
            int_field(prow, 8), PMAX, CAP,
        )  # fmt: skip
        state = tl.where(decided, 1, 2)
        if not decided:
            token = _merged_draw(best_ptr, idx_ptr, row, P, PMAX)
            if (top_p < 1.0) | (k <= V):
                state = state + 1
                big_p = tl.where(top_p < 1.0, top_p * z_lo, 1e300)
                if (top_p < 1.0) & (k > n) & (k <= V):
                    # The top-k mass top-p needs: find the k-th token, then the mass up to it.
                    at = _search(
                        row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, k,
                        False, BLOCK, NPIV,
                    )  # fmt: skip
                    _, g = _above_pass(
                        row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top,
                        tl.full([NPIV], 0, tl.uint64) + (at - 1), False, BLOCK // 4, NPIV,
                    )  # fmt: skip
                    big_p = top_p * tl.max(g, 0).to(tl.float64)
                after = _order_of(
                    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, token
                )
                tl.store(after_ptr + row, after.to(tl.int64))
    tl.store(dec_ptr + row * 2 + 0, token)
    tl.store(dec_ptr + row * 2 + 1, state)
    tl.store(big_p_ptr + row, big_p)


@triton.jit
def final_kernel(
    logits_ptr, stride_l, V, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b, stat_ptr, sidx_ptr,
    zpart_ptr, P, sel_ptr, dec_ptr, big_p_ptr, after_ptr, count_ptr, mass_ptr, best_ptr, idx_ptr,
    rcand_ptr, ridx_ptr, span_ptr, tok_ptr, lp_ptr, top_ids_ptr, top_lp_ptr, rank_ptr,
    BLOCK: tl.constexpr, PMAX: tl.constexpr, RCAP: tl.constexpr, RLCAP: tl.constexpr, TOPK: tl.constexpr,
    NPIV: tl.constexpr, RANK_LIST: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    """The token of each row: decide_kernel's, or its checked argmax, or the slow path's from there;
    then its logprob, the top-k logprobs, and its count in the penalty table. Paths (sel[:, 5]): 0
    greedy, 1 candidates, 2 one parallel draw, 3 the slow path; +4 the top-k logprobs' slow path;
    +8 the candidates took gather_kernel's pass over the row."""
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    prow = p_ptr + row * NF
    top_raw, lse, top, first, _total = _row_stats(stat_ptr, sidx_ptr, zpart_ptr, row, P, V, PMAX)
    token = tl.load(dec_ptr + row * 2 + 0)
    state = tl.load(dec_ptr + row * 2 + 1)
    if state == 3:
        p = tl.arange(0, PMAX)
        pm = p < P
        before = tl.sum(tl.load(count_ptr + row * P + p, mask=pm, other=0), 0)
        mass = tl.sum(tl.load(mass_ptr + row * P + p, mask=pm, other=0), 0)
        big_p = tl.load(big_p_ptr + row)
        k = int_field(prow, 6)
        k = tl.where((k > 0) & (k < V), k, V + 1).to(tl.int32)
        if (before == 0) | ((before < k) & (mass.to(tl.float64) < big_p)):
            state = tl.zeros([], tl.int32) + 2
        else:
            min_q = float_field(prow, 2).to(tl.float64) * 4294967296.0
            lo = tl.load(after_ptr + row).to(tl.uint64)
            token = _draw_slow(
                row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top, first, k, big_p,
                min_q, int_field(prow, 7), int_field(prow, 8), lo, _merged_draw(best_ptr, idx_ptr, row, P, PMAX),
                BLOCK,
            )  # fmt: skip
    tl.store(tok_ptr + row, token.to(tl.int64))
    raw = tl.load(logits_ptr + row.to(tl.int64) * stride_l + token).to(tl.float32)
    tl.store(lp_ptr + row, raw - lse)
    if RANK_LIST:  # before _top_logprobs, whose slow path rewrites the list
        tl.store(
            rank_ptr + row, _listed_rank(prow, sel_ptr, row, rcand_ptr, ridx_ptr, token, raw, RLCAP, TOPK)
        )
    if TOPK > 0:
        slow = _top_logprobs(
            row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top_raw, lse, P, sel_ptr,
            rcand_ptr, ridx_ptr, span_ptr, top_ids_ptr, top_lp_ptr, BLOCK, PMAX, RCAP, RLCAP, TOPK, NPIV,
        )  # fmt: skip
        state = state + tl.where(slow, 4, 0)
    tl.store(sel_ptr + row * SEL + 5, state + 8 * tl.load(sel_ptr + row * SEL + 6))
    slot = int_field(prow, 9)
    if slot != 0:
        entry = ent_ptr + slot * stride_e + token
        tl.store(entry, tl.load(entry) + 1)
        word = bits_ptr + slot * stride_b + (token >> 5)
        tl.store(word, tl.load(word) | (tl.full([], 1, tl.int32) << (token & 31).to(tl.int32)))


@triton.jit
def _listed_rank(
    prow, sel_ptr, row, rcand_ptr, ridx_ptr, token, raw, RLCAP: tl.constexpr, TOPK: tl.constexpr
):  # fmt: skip
    """How many raw logits beat the token, where the row's list of top raw logits provably holds
    them all: it did not overflow, so it holds every token at or above its floor, and the token is
    one of them. Else -1 (sampling_rank.py counts over the row)."""
    if TOPK == 0:  # list_kernel kept no raw list
        return tl.full([], -1, tl.int32)
    whole = (tl.load(sel_ptr + row * SEL + 6) == 0) & (int_field(prow, RANKS) != 0)
    j = tl.arange(0, RLCAP)
    # (A count, not `& whole`: the interpreter refuses a block and a scalar mixed.)
    valid = j < tl.where(whole, tl.load(sel_ptr + row * SEL + 3), 0)
    idx = tl.load(ridx_ptr + row * RLCAP + j, mask=valid, other=-1)
    x = tl.load(rcand_ptr + row * RLCAP + j, mask=valid, other=float("-inf"))
    member = tl.sum((idx == token).to(tl.int32), 0) > 0
    return tl.where(member, tl.sum((valid & (x > raw)).to(tl.int32), 0), -1)


@triton.jit
def _top_logprobs(
    row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top_raw, lse, P, sel_ptr,
    rcand_ptr, ridx_ptr, span_ptr, top_ids_ptr, top_lp_ptr,
    BLOCK: tl.constexpr, PMAX: tl.constexpr, RCAP: tl.constexpr, RLCAP: tl.constexpr, TOPK: tl.constexpr,
    NPIV: tl.constexpr,
):  # fmt: skip
    """The TOPK largest raw logits (ties: lowest index first) as logprobs; whether it took the slow path.
    The row's list (rows RLCAP apart) holds its n top raw logits, then up to RCAP - n of the next
    bucket's (gather_kernel)."""
    p = tl.arange(0, PMAX)
    pm = p < P
    n = tl.load(sel_ptr + row * SEL + 3)
    count = tl.load(sel_ptr + row * SEL + 4)
    lo = tl.min(tl.load(span_ptr + (row * P + p) * 2 + 0, mask=pm, other=0xFFFFFFFF), 0)
    hi = tl.max(tl.load(span_ptr + (row * P + p) * 2 + 1, mask=pm, other=0), 0)
    # Ties in the next bucket are ordered by index, and its first members are in the list.
    use = tl.where(n >= TOPK, n, n + tl.minimum(count, RCAP - n))
    slow = (n < TOPK) & ((lo != hi) | (n + count < TOPK))
    if slow:
        at = _search(
            row, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b, top_raw, TOPK,
            True, BLOCK, NPIV,
        )  # fmt: skip
        pos = n * 0
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inb, x, _s = scores(
                row, cols, V, logits_ptr, stride_l, prow, ent_ptr, stride_e, bits_ptr, stride_b
            )
            mine = inb & (order_key(float_key(x), cols) >= at)
            where = pos + tl.cumsum(mine.to(tl.int32), 0) - 1
            tl.store(rcand_ptr + row * RLCAP + where, x, mask=mine)
            tl.store(ridx_ptr + row * RLCAP + where, cols, mask=mine)
            pos += tl.sum(mine.to(tl.int32), 0)
        use = n * 0 + TOPK
        tl.debug_barrier()
    j = tl.arange(0, RLCAP)
    valid = j < use
    x = tl.load(rcand_ptr + row * RLCAP + j, mask=valid, other=float("-inf"))
    idx = tl.load(ridx_ptr + row * RLCAP + j, mask=valid, other=0)
    c = tl.sort(tl.where(valid, order_key(float_key(x), idx), 0), descending=True)
    idx = (4294967295 - (c & 0xFFFFFFFF)).to(tl.int64)
    x = key_float(c >> 32)
    tl.store(top_ids_ptr + row * TOPK + j, idx, mask=j < TOPK)
    tl.store(top_lp_ptr + row * TOPK + j, x - lse, mask=j < TOPK)
    return slow
