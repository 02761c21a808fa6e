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

from .sampling_final import final_kernel
from .sampling_jit import NFIELDS
from .sampling_passes import gather_kernel, hist_kernel, select_kernel, stats_kernel

CHUNK = 4096  # logits per program in the row-parallel passes
BLOCK = 1024  # logits per loop iteration
BUCKETS = 256
CANDIDATES = 128  # sampling candidates per row
RAW_CANDIDATES = 64  # top-k logprob candidates per row (k <= 20)
PIVOTS = 8  # pivots per pass of the slow path's searches
PASS_WARPS = 8  # warps per program of the row-parallel passes
FINAL_WARPS = 16  # per row program: the slow path's passes hide their latency across 16 warps


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
    sel = torch.empty(rows, 6, dtype=i32, device=dev)
    off, roff, rnext = (torch.empty(rows, parts, dtype=i32, device=dev) for _ in range(3))
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
    # No FMA: penalties round as the torch definition does.
    exact = dict(enable_fp_fusion=False, num_warps=PASS_WARPS)
    stats_kernel[grid](*row_args, stats, sidx, parts, CHUNK=chunk, BLOCK=block, **exact)
    hist_kernel[grid](
        *row_args, stats, parts, hist, rhist, zpart, CHUNK=chunk, BLOCK=block, PMAX=pmax, NB=BUCKETS,
        TOPK=num_top, **exact,
    )  # fmt: skip
    select_kernel[(rows,)](
        hist, rhist, parts, sel, off, roff, rnext, CAP=CANDIDATES, RCAP=RAW_CANDIDATES, PMAX=pmax, NB=BUCKETS,
        TOPK=num_top, **exact,
    )  # fmt: skip
    gather_kernel[grid](
        *row_args, stats, parts, sel, off, roff, rnext, cand, cidx, rcand, ridx, below, span, CHUNK=chunk,
        BLOCK=block, PMAX=pmax, CAP=CANDIDATES, RCAP=RAW_CANDIDATES, TOPK=num_top, **exact,
    )  # fmt: skip
    final_kernel[(rows,)](
        logits, logits.stride(0), vocab, params, entries, entries.stride(0), bits, bits.stride(0),
        stats, sidx, zpart, parts, sel, cand, cidx, rcand, ridx, below, span, tokens, logprobs, top_ids, top_lp,
        BLOCK=block, PMAX=pmax, CAP=CANDIDATES, RCAP=RAW_CANDIDATES, TOPK=num_top, NPIV=PIVOTS,
        enable_fp_fusion=False, num_warps=FINAL_WARPS,
    )  # fmt: skip
    if paths is not None:
        paths.copy_(sel[:, 5])
    if not num_top:
        return tokens, logprobs, None, None
    return tokens, logprobs, top_ids, top_lp
