"""A step's inputs as host data, and a launched step's results.

The scheduler's batch becomes a `DecodeStep` or `PrefillStep` on the host: everything the forward
needs, and nothing about sequences. One rank runs it as is; under tensor parallelism rank 0
broadcasts it and every rank runs the same step on its shard. Rank 0 alone tracks the launched step
(`InflightStep`) and what completing it did (`StepRecord`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampler import SamplingTensors
from .scheduler import ScheduledBatch
from .sequence import Sequence


@dataclass(slots=True)
class InflightStep:
    """A launched step whose sampled tokens are still on their way to the host."""

    batch: ScheduledBatch
    sampled: list[Sequence]  # in row order of `tokens`
    tokens: torch.Tensor  # device
    rows: dict[int, int]  # seq_id -> row in `tokens`, for the next step's inputs
    host_tokens: torch.Tensor
    host_logprobs: torch.Tensor
    ticket: int  # read-back sequence number (readback.py)
    event: torch.cuda.Event | None = None  # under tensor parallelism, or with read-back by event


@dataclass(slots=True)
class StepRecord:
    phase: str
    finished: list[Sequence] = field(default_factory=list)
    new_tokens: list[tuple[Sequence, int]] = field(default_factory=list)


@dataclass(slots=True)
class DecodeStep:
    num_seqs: int  # live rows; rows past this are graph padding
    packed: torch.Tensor  # [rows, FIXED_COLUMNS + W] int64 (decode_inputs.py's layout)
    sampling: SamplingTensors | None  # [rows] on the host; None: every row is greedy
    uses_prev: bool  # rows whose SRC_ROW is set take their token from the previous step's tokens
    guided: bool = False  # apply the guided decoder's bitmask (one rank only)


@dataclass(slots=True)
class PrefillStep:
    """int64 host tensors: T tokens of S sequences, R of which sample."""

    ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] cache slot of each token
    tables: torch.Tensor  # [S, W] block tables, zero-padded
    ends: torch.Tensor  # [S] tokens in the cache after this step
    query_lens: torch.Tensor  # [S]
    logits_rows: torch.Tensor  # [R] the token whose logits each sampling sequence samples from
    sampling: SamplingTensors | None  # [R]; None: greedy


def sampling_tensors(seqs: list[Sequence], rows: int) -> SamplingTensors:
    """The sampling parameters of `seqs`, padded to `rows` with greedy rows, on the host."""
    pad = rows - len(seqs)
    return SamplingTensors(
        torch.tensor([s.params.temperature for s in seqs] + [0.0] * pad, dtype=torch.float32),
        torch.tensor([s.params.top_k for s in seqs] + [0] * pad, dtype=torch.int64),
        torch.tensor([s.params.top_p for s in seqs] + [1.0] * pad, dtype=torch.float32),
        torch.tensor([s.seed for s in seqs] + [0] * pad, dtype=torch.int64),
        torch.tensor([s.num_generated for s in seqs] + [0] * pad, dtype=torch.int64),
    )


def prefill_step(batch: ScheduledBatch, block_size: int) -> tuple[PrefillStep, list[Sequence]]:
    """A prefill batch's inputs, and the sequences that sample a token (in row order)."""
    ids, positions, slots, tables, logits_rows, sampled = [], [], [], [], [], []
    bs = block_size
    ends = [start + n for start, n in zip(batch.starts, batch.lens, strict=True)]
    width = max(-(-end // bs) for end in ends)
    offset = 0
    for seq, start, n, samples in zip(batch.seqs, batch.starts, batch.lens, batch.samples, strict=True):
        ids.extend(seq.token_at(i) for i in range(start, start + n))
        positions.extend(range(start, start + n))
        slots.extend(seq.block_table[i // bs] * bs + i % bs for i in range(start, start + n))
        table = seq.block_table[:width]
        tables.append(table + [0] * (width - len(table)))
        offset += n
        if samples:
            logits_rows.append(offset - 1)
            sampled.append(seq)
        seq.num_computed = start + n
    greedy = all(s.params.greedy for s in sampled)
    step = PrefillStep(
        *(
            torch.tensor(v, dtype=torch.int64)
            for v in (ids, positions, slots, tables, ends, batch.lens, logits_rows)
        ),
        sampling=None if greedy else sampling_tensors(sampled, len(sampled)),
    )
    return step, sampled
