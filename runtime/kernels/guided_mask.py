"""A guided step's token bitmask applied to its logits, and min_tokens lifted where the grammar has
ended: the torch definition (guided_mask_triton.py runs it in two kernels).

Row r is constrained when flags[r] != 0; its allowed tokens are the set bits of mask[r] (token t is
bit t % 32 of word t // 32, xgrammar's layout). min_tokens bans a row's stop tokens; where a grammar
has ended, stop tokens are all it allows, so the ban would leave no token at all. The grammar comes
first: a row with no finite logit but stop tokens gets min_tokens 0, and may end. Tokens the row's
biases ban (allowed_token_ids, bad_words: a -inf bias) count as not allowed.

In torch this is about fifteen small launches over [rows, vocab] per step; the kernels do it in one
(greedy) or two (the general sampler's parameters).
"""

from __future__ import annotations

import torch

from .sampling import BIAS_BIT, STOP_BIT, biases


def guided_mask_reference(
    logits: torch.Tensor,
    mask: torch.Tensor,
    flags: torch.Tensor,
    params: torch.Tensor | None = None,
    entries: torch.Tensor | None = None,
    slots_col: int = 0,
    min_tokens_col: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits with every token a constrained row forbids at -inf, params with min_tokens lifted).

    logits [n, V]; mask int32 [>= n, ceil(V / 32)]; flags int32 [>= n]; params int64 [B >= n, F], the
    general sampler's rows (None for greedy), whose slots column indexes entries [slots, V] (the penalty
    table, STOP_BIT marks a row's stop tokens). Pure tensor ops, so a graph captures them.
    """
    n, vocab = logits.shape
    cols = torch.arange(vocab, device=logits.device)
    words = mask[:n].index_select(1, cols // 32)
    allowed = ((words >> (cols % 32).to(torch.int32)) & 1) != 0
    logits = logits.masked_fill(~allowed & (flags[:n, None] != 0), float("-inf"))
    if params is None:
        return logits, None
    rows = params[:n]
    slots = rows[:, slots_col]
    held = entries.index_select(0, slots)
    stop = (held & STOP_BIT) != 0
    banned = ((held & BIAS_BIT) != 0) & (biases(entries).index_select(0, slots) == float("-inf"))
    other = ((logits > float("-inf")) & ~stop & ~banned).any(-1)
    params = params.clone()
    params[:n, min_tokens_col] = torch.where(other, rows[:, min_tokens_col], 0)
    return logits, params
