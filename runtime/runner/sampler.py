"""Sampling as pure tensor ops, capturable in a graph: greedy, or the general sampler (penalties,
min_tokens, temperature, top-k, top-p, min_p, per-request seeds, top-k logprobs).

The general sampler's definition is kernels/sampling.py; `ops.sample` runs it (plain torch, or
fused Triton kernels on CUDA). Randomness comes from a counter-based hash of (seed, output index,
token id), not from a generator's state, so a request's tokens do not depend on what else is in its
batch, on preemption, or on whether the step ran eagerly or from a CUDA graph.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from ..kernels.sampling import uniform_noise

__all__ = ["TOP_LOGPROBS", "Sampled", "SamplingTensors", "sample", "uniform_noise"]

TOP_LOGPROBS = 20  # top-k logprobs a step returns when any row asks (SamplingParams' MAX_LOGPROBS)


# Per-row parameters, in the packed order; neutral values leave a row greedy.
FLOAT_FIELDS = {
    "temperature": 0.0,  # 0 = greedy
    "top_p": 1.0,  # 1 = off
    "min_p": 0.0,  # 0 = off
    "repetition": 1.0,  # 1 = off
    "presence": 0.0,
    "frequency": 0.0,
}
INT_FIELDS = {
    "top_k": 0,  # 0 = off
    "seeds": 0,
    "counters": 0,  # tokens generated before this one (pending ones included)
    "slots": 0,  # the row's penalty-table slot, 0 = none
    "min_tokens": 0,  # stop tokens are banned while counters < min_tokens
    "ranks": 0,  # 1: the row asked for logprobs, so its token's rank is counted (kernels/sampling_rank.py)
}
FIELDS = (*FLOAT_FIELDS, *INT_FIELDS)


@dataclass(slots=True)
class SamplingTensors:
    """Every row's sampling parameters in one int64 tensor [B, len(FIELDS)], so a step moves them
    in one copy (into a graph's static buffer, across ranks) and a kernel finds a row's together;
    float fields hold their float32 bits. Read them by name: `p.temperature`, `p.top_k`, ... ([B])."""

    data: torch.Tensor

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    def to(self, device: torch.device) -> SamplingTensors:
        return SamplingTensors(self.data.to(device, non_blocking=True))

    def copy_(self, src: SamplingTensors) -> None:
        """Into static buffers, as a graph replay reads them."""
        self.data.copy_(src.data, non_blocking=True)

    @classmethod
    def neutral(cls, n: int, device: torch.device | str = "cpu", **columns) -> SamplingTensors:
        """n greedy rows; `columns` give the first rows' values of some fields (lists or tensors)."""
        unknown = set(columns) - set(FIELDS)
        if unknown:
            raise TypeError(f"SamplingTensors has no fields {sorted(unknown)}")
        data = torch.empty(n, len(FIELDS), dtype=torch.int64)
        for i, (name, neutral) in enumerate({**FLOAT_FIELDS, **INT_FIELDS}.items()):
            dtype = torch.float32 if name in FLOAT_FIELDS else torch.int64
            values = torch.full((n,), neutral, dtype=dtype)
            if name in columns:
                given = torch.as_tensor(columns[name], dtype=dtype)
                values[: len(given)] = given
            data[:, i] = _to_bits(values) if name in FLOAT_FIELDS else values
        return cls(data.to(device))

    @classmethod
    def from_flat(cls, n: int, values: list[int]) -> SamplingTensors:
        """The first rows' fields, row after row (floats as float32 bits: `float_bits`), then neutral
        rows up to n; on the host. One struct.pack: a step packs every row (64 rows: ~5 us)."""
        count = len(values) // len(FIELDS)
        values = values + _NEUTRAL_ROW * (n - count)
        data = bytearray(struct.pack(f"{len(values)}q", *values))
        return cls(torch.frombuffer(data, dtype=torch.int64).view(n, len(FIELDS)))

    @classmethod
    def empty(cls, n: int, device: torch.device) -> SamplingTensors:
        return cls.neutral(n, device)


def _to_bits(values: torch.Tensor) -> torch.Tensor:
    return values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def float_bits(*values: float) -> tuple[int, ...]:
    """Python floats as the float32 bits SamplingTensors keeps."""
    return struct.unpack(f"{len(values)}I", struct.pack(f"{len(values)}f", *values))


_NEUTRAL_ROW = [*float_bits(*FLOAT_FIELDS.values()), *INT_FIELDS.values()]


def _field(i: int, is_float: bool) -> property:
    if is_float:
        return property(lambda self: self.data[:, i].to(torch.int32).view(torch.float32))
    return property(lambda self: self.data[:, i])


for _i, _name in enumerate(FIELDS):
    setattr(SamplingTensors, _name, _field(_i, _name in FLOAT_FIELDS))


SLOTS_COLUMN, MIN_TOKENS_COLUMN = FIELDS.index("slots"), FIELDS.index("min_tokens")


@dataclass(slots=True)
class Sampled:
    """What a step samples, per row: the token, its logprob under the model's own distribution
    (log-softmax of the raw logits), and the top-k of that distribution when a row asked for them."""

    tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32
    top_ids: torch.Tensor | None = None  # [B, K] int64
    top_logprobs: torch.Tensor | None = None  # [B, K] float32
    # [B, P] int32: how many tokens of each part of the vocabulary beat the row's token, in rows
    # whose `ranks` field is set (the general sampler's): its rank is 1 + the row's sum.
    rank_counts: torch.Tensor | None = None

    def head(self, n: int, top: bool = True) -> Sampled:
        """The first n rows (the live ones; the rest are graph padding); without top-k unless `top`."""
        top_ids = None if self.top_ids is None or not top else self.top_ids[:n]
        top_logprobs = None if self.top_logprobs is None or not top else self.top_logprobs[:n]
        counts = None if self.rank_counts is None else self.rank_counts[:n]
        return Sampled(self.tokens[:n], self.logprobs[:n], top_ids, top_logprobs, counts)


def sample(
    logits: torch.Tensor, params: SamplingTensors | None, ops, penalties=None, top: bool = False
) -> Sampled:
    """logits [B, V] -> the sampled rows. params None: all greedy (`ops.greedy`, the fast path).

    Otherwise `ops.sample` runs the general sampler and counts each token in its row's slot of
    `penalties` (a PenaltyTable); `top` adds the TOP_LOGPROBS most likely tokens of each row.
    """
    if params is None:
        return Sampled(*ops.greedy(logits))  # a greedy token ranks first: nothing beats the argmax
    return Sampled(*ops.sample(logits, params, penalties.entries, penalties.bits, TOP_LOGPROBS if top else 0))
