"""The general sampler (definition: sampling.py) as Triton kernels, with no sort of the vocabulary.

Most rows keep few tokens (a top-k, or a peaked distribution under top-p/min_p), so the kernels
first gather, for each row, every token above a threshold chosen to leave at most CANDIDATES of them,
and decide the row on those alone when that is provably exact. Rows whose kept set may reach past
them (no top-k, a flat distribution) draw the Gumbel argmax over the whole row: with no top-k or
top-p that is the token; else it is kept with probability about top_p, which one more pass checks.
The passes over the vocabulary run CHUNK logits per program, so a row spreads over many SMs:

1. stats: per chunk, the raw logits' max, the penalized scores' max and first argmax, and the
   maxima of a few disjoint groups of its tokens.
2. floor (a program per row): a floor that more than CANDIDATES tokens provably reach, and few pass
   (and one for the raw logits, for the top-k logprobs).
3. list: per chunk, the raw logits' exp-sum (for logprobs), the total mass (fixed point), the best
   score below the floor, and the tokens at or above it appended to the row's candidate list (slots
   from an atomic add: decide sorts the list, so slot order is free). They are the row's top tokens,
   and usually all of its candidates. Rows whose list overflowed (LISTED) take steps 4 to 6; the
   others' programs there return at once.
4. hist: per chunk, a histogram of each token's distance below the row's top score (and below the
   top raw logit), in buckets 1/8 apart on a log scale of the float order; tokens past the floor's
   bucket are not counted.
5. select (a program per row): the deepest bucket that keeps the candidates within their cap.
6. gather: those candidates, in a pass over the row, and per chunk the best score left out.
7. draw: for rows that may keep more than their candidates, each chunk's Gumbel argmax.
8. decide (a program per row): the candidates sorted by (score desc, index asc) under the exact
   top-k/top-p/min_p rules and the Gumbel draw, when they provably hold every kept token; else the
   whole row's argmax, final when only min_p limits the draw, or to be checked.
9. draw again, for rows to check: the tokens and mass before their argmax, and the argmax after it.
10. final (a program per row): the checked argmax, or if it is out, the exact slow path from there:
   a rejection loop over the whole row whose candidate only moves up the order, bisecting the
   undecided range at each pass. Then the top-k logprobs (their own slow path when ties overflow
   the candidates) and the token's count in its row's penalty-table slot.
"""

from __future__ import annotations

import torch

from .sampling_final import decide_kernel, final_kernel
from .sampling_jit import NFIELDS, SEL_FIELDS
from .sampling_passes import (
    draw_kernel,
    floor_kernel,
    gather_kernel,
    hist_kernel,
    list_kernel,
    select_kernel,
    stats_kernel,
)
from .triton_ops import pdl_args

CHUNK = 4096  # logits per program in the row-parallel passes
BLOCK = 256  # logits per loop iteration (fewer registers, more programs per SM than 512)
BUCKETS = 256
CANDIDATES = 128  # tokens a row's floor lies under, and the cap of a cut's candidates
RAW_CANDIDATES = 64  # the same for the top-k logprobs (k <= 20)
LISTED = 512  # the candidate list: tokens at or above a row's floor (about 170 in a random 128k row)
RAW_LISTED = 256  # the same for the raw logits (the top-k logprobs')
PIVOTS = 8  # pivots per pass of the slow path's searches
PASS_WARPS = 4  # warps per program of the row-parallel passes (8 were slower: bench/results/round12)
FINAL_WARPS = 16  # per row program: the slow path's passes hide their latency across 16 warps


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def bound_groups(parts: int, block: int) -> int:
    """Groups per chunk in stats_kernel: enough that a row's group maxima outnumber its candidates,
    which is what lets hist_kernel skip the tokens below their least."""
    return min(block, _pow2(-(-(CANDIDATES + 1) // parts)))


class _Scratch:
    """The kernels' working buffers for `rows` rows of `parts` chunks (allocated per call: in a
    captured graph they come from its pool once)."""

    def __init__(self, rows: int, parts: int, groups: int, num_top: int, device: torch.device) -> None:
        f32, i32, i64 = torch.float32, torch.int32, torch.int64

        def new(*shape, dtype=i32):
            return torch.empty(*shape, dtype=dtype, device=device)

        self.stats, self.sidx, self.zpart = (
            new(rows, parts, 3, dtype=f32),
            new(rows, parts),
            new(rows, parts, dtype=i64),
        )
        self.gmax, self.floors = new(rows, parts, 2, groups, dtype=f32), new(rows, 2, dtype=f32)
        # How many tokens list_kernel found at or above the floors (past the lists' ends: counted).
        self.lfill = new(rows, 2)
        self.hist = new(rows, parts, BUCKETS)
        self.rhist = new(rows, parts, BUCKETS) if num_top else self.hist
        # fill: how many of each list gather_kernel has placed (zeroed by select_kernel).
        self.sel, self.fill, self.rnext = new(rows, SEL_FIELDS), new(rows, 2), new(rows, parts)
        self.cand, self.cidx = new(rows, LISTED, dtype=f32), new(rows, LISTED)
        self.rcand, self.ridx = new(rows, RAW_LISTED, dtype=f32), new(rows, RAW_LISTED)
        self.below = new(rows, parts, dtype=f32)
        self.span = new(rows, parts, 2, dtype=i64) if num_top else self.zpart
        # draw_kernel's per-chunk results: tokens and mass before a token, and an argmax.
        self.draw = (
            new(rows, parts),
            new(rows, parts, dtype=i64),
            new(rows, parts, dtype=f32),
            new(rows, parts),
        )
        self.dec, self.big_p, self.after = new(rows, 2), new(rows, dtype=torch.float64), new(rows, dtype=i64)
        self.tokens, self.logprobs = new(rows, dtype=i64), new(rows, dtype=f32)
        self.top_ids, self.top_lp = (
            new(rows, max(num_top, 1), dtype=i64),
            new(rows, max(num_top, 1), dtype=f32),
        )


def sample(
    logits,
    p,
    entries,
    bits,
    num_top: int,
    chunk: int = CHUNK,
    block: int = BLOCK,
    paths=None,
    listed_ranks=None,
):
    """(tokens, logprobs, top_ids | None, top_logprobs | None) of logits [B, V]: sampling.py's
    definition, and each token counted in its row's slot of the penalty table.

    `paths` [B] int32, if given, says how each row was decided (for tests and profiling): 0 greedy,
    1 from its candidates, 2 by one parallel draw, 3 by the slow path; plus 4 when its top-k
    logprobs took the slow path, and 8 when its candidates took a pass over the row.

    `listed_ranks` [B] int32, if given, takes each row's count of raw logits above its token where
    its list of top raw logits holds them (rows whose `ranks` field is set), else -1: what
    sampling_rank.rank_counts then needs no pass over the row for.
    """
    rows, vocab = logits.shape
    if LISTED < CANDIDATES or RAW_LISTED < RAW_CANDIDATES:
        raise ValueError("the candidate lists must hold a cut's candidates")
    if num_top > vocab:
        raise ValueError(f"top-{num_top} logprobs of a vocabulary of {vocab}")
    if num_top > RAW_CANDIDATES:  # the lists' widths; the engine asks for TOP_LOGPROBS (20)
        raise ValueError(f"top-{num_top} logprobs: the kernels return at most {RAW_CANDIDATES}")
    if entries.shape[1] < vocab or entries.stride(1) != 1 or entries.stride(0) < 2 * vocab:
        # A biased entry's bias sits half a row past it (kernels/sampling.py); a copied table lost that.
        raise ValueError("penalty entries must be a PenaltyTable's `entries` view, a row's biases beside it")
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    params = p.data.contiguous()
    if params.shape[1] != NFIELDS:
        raise ValueError(f"sampling parameters have {params.shape[1]} fields; the kernels read {NFIELDS}")
    parts = -(-vocab // chunk)
    pmax = _pow2(parts)
    groups = bound_groups(parts, block)
    w = _Scratch(rows, parts, groups, num_top, logits.device)
    row_args = (logits, logits.stride(0), vocab, params, entries, entries.stride(0), bits, bits.stride(0))
    grid = (rows, parts)
    sizes = dict(CHUNK=chunk, BLOCK=block, PMAX=pmax)
    caps = dict(CAP=CANDIDATES, RCAP=RAW_CANDIDATES, TOPK=num_top)
    lists = dict(LCAP=LISTED, RLCAP=RAW_LISTED)
    # No FMA: penalties round as the torch definition does. Every kernel after the first launches with
    # programmatic dependent launch where the device has it: it starts as the one before drains and
    # waits for its end before reading anything. The first may follow a copy (a guided step's mask),
    # and a programmatic edge after a node that is not a kernel breaks a graph's capture.
    stats_kernel[grid](
        *row_args, w.stats, w.sidx, w.gmax, parts, CHUNK=chunk, BLOCK=block, GROUPS=groups,
        enable_fp_fusion=False, num_warps=PASS_WARPS,
    )  # fmt: skip
    pdl = pdl_args(logits)
    passes = dict(enable_fp_fusion=False, num_warps=PASS_WARPS, **pdl)
    per_row = dict(enable_fp_fusion=False, num_warps=FINAL_WARPS, **pdl)
    floor_kernel[(rows,)](
        w.gmax, w.floors, w.lfill, parts, PMAX=pmax, GROUPS=groups, **caps, **lists, **passes
    )
    list_kernel[grid](
        *row_args, w.stats, w.floors, parts, w.zpart, w.cand, w.cidx, w.rcand, w.ridx, w.lfill, w.below,
        **sizes, TOPK=num_top, **lists, **passes,
    )  # fmt: skip
    hist_kernel[grid](
        *row_args, w.stats, w.floors, parts, w.hist, w.rhist, w.lfill, **sizes, NB=BUCKETS, TOPK=num_top, **lists,
        **passes,
    )  # fmt: skip
    select_kernel[(rows,)](
        w.hist,
        w.rhist,
        parts,
        w.sel,
        w.fill,
        w.rnext,
        w.lfill,
        PMAX=pmax,
        NB=BUCKETS,
        **caps,
        **lists,
        **passes,
    )
    gather_kernel[grid](
        *row_args, w.stats, parts, w.sel, w.fill, w.rnext, w.cand, w.cidx, w.rcand, w.ridx, w.below, w.span,
        **sizes, **caps, **lists, **passes,
    )  # fmt: skip
    draw = (*row_args, w.stats, parts, w.sel, w.dec, w.after, *w.draw)
    draw_kernel[grid](*draw, CHECK=False, **sizes, **passes)
    decide_kernel[(rows,)](
        *row_args, w.stats, w.sidx, w.zpart, parts, w.sel, w.cand, w.cidx, w.below, w.draw[2], w.draw[3], w.dec,
        w.big_p, w.after, BLOCK=block, PMAX=pmax, CAP=LISTED, NPIV=PIVOTS, **per_row,
    )  # fmt: skip
    draw_kernel[grid](*draw, CHECK=True, **sizes, **passes)
    final_kernel[(rows,)](
        *row_args, w.stats, w.sidx, w.zpart, parts, w.sel, w.dec, w.big_p, w.after, *w.draw, w.rcand, w.ridx,
        w.span, w.tokens, w.logprobs, w.top_ids, w.top_lp, w.tokens if listed_ranks is None else listed_ranks,
        BLOCK=block, PMAX=pmax, RCAP=RAW_CANDIDATES, RLCAP=RAW_LISTED, TOPK=num_top, NPIV=PIVOTS,
        RANK_LIST=listed_ranks is not None, **per_row,
    )  # fmt: skip
    if paths is not None:
        paths.copy_(w.sel[:, 5])
    if not num_top:
        return w.tokens, w.logprobs, None, None
    return w.tokens, w.logprobs, w.top_ids, w.top_lp
