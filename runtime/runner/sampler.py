"""Sampling as pure tensor ops, capturable in a graph: greedy, or the general sampler (penalties,
min_tokens, temperature, top-k, top-p, min_p, per-request seeds, top-k logprobs).

The general sampler's definition is kernels/sampling.py; `ops.sample` runs it (plain torch, or
fused Triton kernels on CUDA). Randomness comes from a counter-based hash of (seed, output index,
token id), not from a generator's state, so a request's tokens do not depend on what else is in its
batch, on preemption, or on whether the step ran eagerly or from a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..kernels.sampling import uniform_noise

__all__ = ["TOP_LOGPROBS", "Sampled", "SamplingTensors", "sample", "uniform_noise"]

TOP_LOGPROBS = 20  # top-k logprobs a step returns when any row asks (SamplingParams' MAX_LOGPROBS)


@dataclass(slots=True)
class SamplingTensors:
    """Per-row parameters, all [B]; static buffers when a graph replays them. Neutral values
    (temperature 0, top_k 0, top_p 1, min_p 0, penalties off, slot 0) leave a row greedy."""

    temperature: torch.Tensor  # float32, 0 = greedy
    top_k: torch.Tensor  # int64, 0 = off
    top_p: torch.Tensor  # float32, 1 = off
    min_p: torch.Tensor  # float32, 0 = off
    seeds: torch.Tensor  # int64
    counters: torch.Tensor  # int64: tokens generated before this one (pending ones included)
    slots: torch.Tensor  # int64: the row's penalty-table slot, 0 = none
    repetition: torch.Tensor  # float32, 1 = off
    presence: torch.Tensor  # float32, 0 = off
    frequency: torch.Tensor  # float32, 0 = off
    min_tokens: torch.Tensor  # int64: stop tokens are banned while counters < min_tokens

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def to(self, device: torch.device) -> SamplingTensors:
        return SamplingTensors(*(x.to(device, non_blocking=True) for x in self.tensors()))

    def copy_(self, src: SamplingTensors) -> None:
        """Into static buffers, as a graph replay reads them."""
        for d, s in zip(self.tensors(), src.tensors(), strict=True):
            d.copy_(s)

    @classmethod
    def neutral(cls, n: int, device: torch.device | str = "cpu", **columns) -> SamplingTensors:
        """n greedy rows; `columns` give the first rows' values of some fields (lists or tensors)."""
        unknown = set(columns) - set(_NEUTRAL)
        if unknown:
            raise TypeError(f"SamplingTensors has no fields {sorted(unknown)}")
        out = []
        for name, neutral in _NEUTRAL.items():
            t = torch.full((n,), neutral, dtype=torch.int64 if name in _INT_FIELDS else torch.float32)
            if name in columns:
                values = torch.as_tensor(columns[name], dtype=t.dtype)
                t[: len(values)] = values
            out.append(t.to(device))
        return cls(*out)

    @classmethod
    def empty(cls, n: int, device: torch.device) -> SamplingTensors:
        return cls.neutral(n, device)


_INT_FIELDS = frozenset({"top_k", "seeds", "counters", "slots", "min_tokens"})
_NEUTRAL = {
    "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seeds": 0, "counters": 0, "slots": 0,
    "repetition": 1.0, "presence": 0.0, "frequency": 0.0, "min_tokens": 0,
}  # fmt: skip
assert tuple(_NEUTRAL) == tuple(f.name for f in fields(SamplingTensors))


@dataclass(slots=True)
class Sampled:
    """What a step samples, per row: the token, its logprob under the model's own distribution
    (log-softmax of the raw logits), and the top-k of that distribution when a row asked for them."""

    tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32
    top_ids: torch.Tensor | None = None  # [B, K] int64
    top_logprobs: torch.Tensor | None = None  # [B, K] float32

    def head(self, n: int, top: bool = True) -> Sampled:
        """The first n rows (the live ones; the rest are graph padding); without top-k unless `top`."""
        top_ids = None if self.top_ids is None or not top else self.top_ids[:n]
        top_logprobs = None if self.top_logprobs is None or not top else self.top_logprobs[:n]
        return Sampled(self.tokens[:n], self.logprobs[:n], top_ids, top_logprobs)


def sample(
    logits: torch.Tensor, params: SamplingTensors | None, ops, penalties=None, top: bool = False
) -> Sampled:
    """logits [B, V] -> the sampled rows. params None: all greedy (`ops.greedy`, the fast path).

    Otherwise `ops.sample` runs the general sampler and counts each token in its row's slot of
    `penalties` (a PenaltyTable); `top` adds the TOP_LOGPROBS most likely tokens of each row.
    """
    if params is None:
        return Sampled(*ops.greedy(logits))
    return Sampled(*ops.sample(logits, params, penalties.entries, penalties.bits, TOP_LOGPROBS if top else 0))
