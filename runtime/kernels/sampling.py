"""The general sampler's definition in plain torch ops: penalties, min_tokens, temperature, top-k,
top-p, min_p, seeded Gumbel-max, and the top-k logprobs of the raw logits. TritonOps runs the same
definition as fused kernels (sampling_triton.py); this is the reference they are tested against.

A row's steps, in the order HF transformers and vLLM apply them:
1. Penalties on the raw fp32 logits x, read from the row's penalty-table entry (PROMPT_BIT: the
   token is in the prompt, STOP_BIT: a stop token, BIAS_BIT: the token has a bias, low bits: times
   generated): first the bias (logit_bias; -inf for a token allowed_token_ids or bad_words bans), as
   vLLM adds it before penalties; then repetition (HF: x / r if x > 0 else x * r, on prompt and
   generated tokens), frequency (minus f * count) and presence (minus p if generated) as OpenAI
   defines them; stop tokens are -inf while the row has generated fewer than min_tokens.
2. Temperature 0: the first argmax of those logits. Otherwise s = logits * (1 / temperature), the
   reciprocal rounded to fp32 once per row (a multiply per token is cheaper than a division).
3. Tokens in the order (s descending, index ascending); rank r. Masses are fixed point,
   q = floor(exp(s - max s) * 2**32), so sums are exact in any order. A token stays when r == 0,
   or when r < top_k (0: off), the mass before it is below top_p times the top-k mass (top_p 1:
   off), and q >= min_p * 2**32.
4. The token is the first argmax, over those that stay, of s - log(-log u), u a pure function of
   (seed, counter, token) (`uniform_noise`): Gumbel-max, so it is a draw from softmax(s) restricted
   to them, independent of the batch.
"""

from __future__ import annotations

import torch

# The penalty table's entry layout (int32 per (slot, token)). A slot's row holds its entries, then as
# many float32 biases, half the row's stride on (`biases`): kernels find a bias without another pointer.
PROMPT_BIT = 1 << 30
STOP_BIT = 1 << 29
BIAS_BIT = 1 << 28
COUNT_MASK = BIAS_BIT - 1
MASS_SCALE = float(1 << 32)

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic on every device).
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB
# 23 bits, not 24: (2**24 - 1) + 0.5 rounds to 2**24 in float32, so u was 1.0 once in 2**24 draws,
# the Gumbel noise +inf, and on a masked (-inf) token -inf + inf = NaN, which drew token `vocab`.
_MASK23 = (1 << 23) - 1


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, cols: torch.Tensor | int) -> torch.Tensor:
    """Floats in (0, 1), a pure function of (seed, counter, column): [B, V] for `cols` an int V,
    else one per (row, cols[row, j])."""
    if isinstance(cols, int):
        cols = torch.arange(cols, device=seeds.device, dtype=torch.int64)[None, :]
    x = (seeds * _GOLDEN + counters)[:, None] * _GOLDEN + cols
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return unit_float(_shr(x, 41))


def unit_float(bits: torch.Tensor) -> torch.Tensor:
    """The low 23 bits of int64 `bits` as a float32 strictly inside (0, 1)."""
    return ((bits & _MASK23).float() + 0.5) * (1.0 / (1 << 23))


def gumbel(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(u))


def biases(entries: torch.Tensor) -> torch.Tensor:
    """The float32 biases beside a penalty table's `entries` [slots, V] (its layout: a row's biases
    start half its stride on), read where an entry has BIAS_BIT; zeros for bare entries (no table
    sets BIAS_BIT without the biases beside it)."""
    half = entries.stride(0) // 2
    if half < entries.shape[1]:  # bare entries, not a penalty table's: no biases beside them
        return torch.zeros(entries.shape, dtype=torch.float32, device=entries.device)
    beside = entries.as_strided(entries.shape, entries.stride(), entries.storage_offset() + half)
    return beside.view(torch.float32)


def penalize(x: torch.Tensor, p, entries: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Step 1 on fp32 logits [B, V]; `entries` are the rows' penalty-table entries [B, V], `bias`
    their biases."""
    x = torch.where((entries & BIAS_BIT) != 0, x + bias, x)
    count = entries & COUNT_MASK
    seen = (entries & (COUNT_MASK | PROMPT_BIT)) != 0
    rep = p.repetition[:, None]
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - p.frequency[:, None] * count.float()
    x = x - p.presence[:, None] * (count > 0).float()
    banned = ((entries & STOP_BIT) != 0) & (p.counters < p.min_tokens)[:, None]
    return x.masked_fill(banned, float("-inf"))


def kept_in_order(s: torch.Tensor, p) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3: (order, kept), both [B, V]: tokens by (s desc, index asc), and which of them stay."""
    s, order = s.sort(dim=-1, descending=True, stable=True)
    vocab = s.shape[-1]
    top = s[:, :1]
    q = torch.where(s > float("-inf"), torch.floor(torch.exp(s - top) * MASS_SCALE), 0.0).long()
    rank = torch.arange(vocab, device=s.device)[None, :]
    k = torch.where(p.top_k > 0, p.top_k.clamp_max(vocab), vocab)[:, None]
    in_k = rank < k
    before = q.cumsum(-1) - q
    z_k = (q * in_k).sum(-1, keepdim=True)
    top_p = p.top_p.double()[:, None]
    in_p = (before.double() < top_p * z_k.double()) | (top_p >= 1)
    in_min_p = q.double() >= p.min_p.double()[:, None] * MASS_SCALE
    return order, (in_k & in_p & in_min_p) | (rank == 0)


def sample_reference(logits: torch.Tensor, p, entries: torch.Tensor, bits: torch.Tensor, num_top: int):
    """(tokens, logprobs, top_ids | None, top_logprobs | None) of logits [B, V], and each token
    recorded in its row's slot of the penalty table (`entries` [slots, V], `bits` [slots, words]:
    which entries are non-zero; slot 0 is the shared empty row of requests without penalties)."""
    x = logits.float()
    vocab = x.shape[-1]
    rows = entries.index_select(0, p.slots)
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # as TorchOps.greedy: greedy rows match it bit for bit
    pen = penalize(x, p, rows, biases(entries).index_select(0, p.slots))
    hot = p.temperature > 0
    s = pen * (1.0 / torch.where(hot, p.temperature, 1.0))[:, None]
    order, kept = kept_in_order(s, p)
    z = s.gather(1, order) + gumbel(uniform_noise(p.seeds, p.counters, order))
    z = z.masked_fill(~kept, float("-inf"))
    # The first argmax by token index: ties in z go to the lowest index, as in the kernel.
    best = z.max(dim=-1, keepdim=True).values
    drawn = torch.where(z == best, order, vocab).min(dim=-1).values
    tokens = torch.where(hot, drawn, pen.argmax(dim=-1))
    record(entries, bits, p.slots, tokens)
    top_ids = top_lp = None
    if num_top:
        top_x, top_ids = x.sort(dim=-1, descending=True, stable=True)
        top_ids, top_lp = top_ids[:, :num_top], top_x[:, :num_top] - lse
    return tokens, (x.gather(1, tokens[:, None]) - lse)[:, 0], top_ids, top_lp


def rank_counts_reference(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """How many raw logits beat each row's token, [B, 1] int32: its rank is 1 + that (vLLM's)."""
    x = logits.float()
    return (x > x.gather(1, tokens[:, None])).sum(dim=-1, keepdim=True).to(torch.int32)


def word_bits(tokens: torch.Tensor) -> torch.Tensor:
    """The bit of each token in its int32 word of the `bits` summary (bit 31 is the sign)."""
    return torch.bitwise_left_shift(torch.ones_like(tokens, dtype=torch.int64), tokens & 31).to(torch.int32)


def record(entries: torch.Tensor, bits: torch.Tensor, slots: torch.Tensor, tokens: torch.Tensor) -> None:
    """Count each row's new token in its slot; rows of slot 0 change nothing (capturable: no sync).

    A slot belongs to one row, so only slot 0 repeats, and its rows write back what they read.
    """
    live = slots != 0
    entries.index_put_((slots, tokens), live.to(entries.dtype), accumulate=True)
    words = tokens >> 5
    bits[slots, words] = bits[slots, words] | torch.where(live, word_bits(tokens), 0)
