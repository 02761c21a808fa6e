"""A sampled token's rank in its row's distribution: 1 + how many raw logits beat it (vLLM's rank).

Only rows that asked for logprobs count (their `ranks` field). A row the sampler already ranked
from its list of top raw logits (`known`, final_kernel's) or whose token is among its top-k
logprobs takes that; only the rest cost a pass over the row, spread over programs of CHUNK logits,
each writing its part's count (the host sums them), so no atomics and no zeroing. Rows that asked
for nothing return at once: the kernel rides in every general step's graph. The definition in
torch ops: sampling.py's `rank_counts_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sampling_jit import NF, RANKS, RANKS_FIELD, int_field
from .triton_kernels import _release, _wait
from .triton_ops import pdl_args

__all__ = ["RANKS_FIELD", "rank_counts", "rank_kernel"]

CHUNK = 4096
BLOCK = 1024


@triton.jit
def rank_kernel(
    logits_ptr, stride_l, V, p_ptr, tok_ptr, top_ptr, known_ptr, out_ptr, P, TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, KNOWN: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    _release(USE_PDL)  # the next kernel launches now and waits for this one's end
    _wait(USE_PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    if int_field(p_ptr + row * NF, RANKS) == 0:
        return
    if KNOWN:
        known = tl.load(known_ptr + row)
        if known >= 0:
            tl.store(out_ptr + row * P + part, tl.where(part == 0, known, 0))
            return
    base = logits_ptr + row.to(tl.int64) * stride_l
    token = tl.load(tok_ptr + row)
    raw = tl.load(base + token).to(tl.float32)
    if TOPK > 0:
        j = tl.arange(0, TOPK_P2)
        ids = tl.load(top_ptr + row * TOPK + j, mask=j < TOPK, other=-1)
        if tl.sum((ids == token).to(tl.int32), 0) > 0:
            # Every logit above the token's is among the top ones before it.
            above = tl.load(base + ids, mask=ids >= 0, other=float("-inf")).to(tl.float32) > raw
            tl.store(out_ptr + row * P + part, tl.where(part == 0, tl.sum(above.to(tl.int32), 0), 0))
            return
    count = tl.zeros([BLOCK], tl.int32)
    for start in range(0, CHUNK, BLOCK):
        cols = part * CHUNK + start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        count += (x > raw).to(tl.int32)
    tl.store(out_ptr + row * P + part, tl.sum(count, 0))


def rank_counts(
    logits: torch.Tensor,
    params,
    tokens: torch.Tensor,
    top_ids: torch.Tensor | None,
    chunk: int = CHUNK,
    block: int = BLOCK,
    known: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, P] int32 per-part counts of logits above each row's token, in rows whose `ranks` field is
    set (others: unwritten). `known` [B] int32: counts already found (-1: not found), as
    `sampling_triton.sample`'s `listed_ranks` gives them."""
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    rows, vocab = logits.shape
    parts = -(-vocab // chunk)
    out = torch.empty(rows, parts, dtype=torch.int32, device=logits.device)
    topk = 0 if top_ids is None else top_ids.shape[1]
    top = top_ids.contiguous() if top_ids is not None else tokens
    rank_kernel[(rows, parts)](
        logits, logits.stride(0), vocab, params.data, tokens, top, known if known is not None else tokens, out,
        parts, TOPK=topk, TOPK_P2=triton.next_power_of_2(max(topk, 1)), CHUNK=chunk, BLOCK=block,
        KNOWN=known is not None, **pdl_args(logits),
    )  # fmt: skip
    return out
