"""Sampling as pure tensor ops: greedy, temperature, top-k, top-p, per-request seeds; capturable in a graph.

Randomness comes from a counter-based hash of (seed, output index, token id), not from a generator's
state, so a request's tokens do not depend on what else is in its batch, on preemption, or on whether
the step ran eagerly or from a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic on every device).
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB
_MASK24 = (1 << 24) - 1


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, V] floats in (0, 1), a pure function of (seed, counter, column)."""
    cols = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = (seeds * _GOLDEN + counters)[:, None] * _GOLDEN + cols[None, :]
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return ((_shr(x, 40) & _MASK24).float() + 0.5) * (1.0 / (1 << 24))


@dataclass(slots=True)
class SamplingTensors:
    """Per-row parameters on the device; static buffers when a graph replays them."""

    temperature: torch.Tensor  # [B] float32, 0 = greedy
    top_k: torch.Tensor  # [B] int64, 0 = off
    top_p: torch.Tensor  # [B] float32, 1 = off
    seeds: torch.Tensor  # [B] int64
    counters: torch.Tensor  # [B] int64: index of the token being sampled

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.temperature, self.top_k, self.top_p, self.seeds, self.counters)

    def to(self, device: torch.device) -> SamplingTensors:
        return SamplingTensors(*(x.to(device, non_blocking=True) for x in self.tensors()))

    def copy_(self, src: SamplingTensors) -> None:
        """Into static buffers, as a graph replay reads them."""
        for d, s in zip(self.tensors(), src.tensors(), strict=True):
            d.copy_(s)

    @classmethod
    def empty(cls, n: int, device: torch.device) -> SamplingTensors:
        return cls(
            torch.zeros(n, device=device),
            torch.zeros(n, dtype=torch.int64, device=device),
            torch.ones(n, device=device),
            torch.zeros(n, dtype=torch.int64, device=device),
            torch.zeros(n, dtype=torch.int64, device=device),
        )


@dataclass(slots=True)
class Sampled:
    """What a step samples, per row: the token, its logprob under the model's own distribution
    (log-softmax of the raw logits), and the top-k of that distribution when a row asked for them."""

    tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32
    top_ids: torch.Tensor | None = None  # [B, K] int64
    top_logprobs: torch.Tensor | None = None  # [B, K] float32

    def head(self, n: int) -> Sampled:
        """The first n rows (the live ones; the rest are graph padding)."""
        top_ids = None if self.top_ids is None else self.top_ids[:n]
        top_logprobs = None if self.top_logprobs is None else self.top_logprobs[:n]
        return Sampled(self.tokens[:n], self.logprobs[:n], top_ids, top_logprobs)


def sample(logits: torch.Tensor, params: SamplingTensors | None, greedy=None) -> Sampled:
    """logits [B, V] -> the sampled rows. params None: all greedy.

    `greedy(logits) -> (tokens, logprobs)` is the all-greedy fast path (a fused kernel on CUDA).
    """
    if params is None and greedy is not None:
        return Sampled(*greedy(logits))
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if params is None:
        tokens = greedy
    else:
        tokens = torch.where(params.temperature > 0, _sample_random(logits, params), greedy)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    return Sampled(tokens, logprobs)


def _sample_random(logits: torch.Tensor, p: SamplingTensors) -> torch.Tensor:
    scaled = logits / p.temperature.clamp_min(1e-6)[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(p.top_k > 0, p.top_k.clamp_max(vocab), vocab)
    drop = ranks >= k[:, None]
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
    drop |= (probs.cumsum(-1) - probs) >= p.top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    filtered = torch.empty_like(scaled).scatter_(1, order, sorted_logits)
    # Gumbel-max with counter-based noise: argmax(logit - log(-log u)) samples softmax(logit).
    u = uniform_noise(p.seeds, p.counters, vocab)
    return (filtered - torch.log(-torch.log(u))).argmax(dim=-1)
