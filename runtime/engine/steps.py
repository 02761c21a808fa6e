"""From a scheduled batch to a step payload, and a launched step's results.

The scheduler's batch becomes a `DecodeStep` or `PrefillStep` (runner/step_inputs.py) on the host.
Rank 0 alone tracks the launched step (`InflightStep`) and what completing it did (`StepRecord`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..runner.decode_inputs import CONTEXT_LEN, FIXED_COLUMNS, POSITION, SLOT, SRC_ROW, TOKEN
from ..runner.sampler import Sampled, SamplingTensors
from ..runner.step_inputs import PrefillStep
from .scheduler import ScheduledBatch
from .sequence import Sequence

# stage() writes a row's fixed columns as one tuple in this order.
assert tuple(range(FIXED_COLUMNS)) == (TOKEN, SRC_ROW, POSITION, SLOT, CONTEXT_LEN)


@dataclass(slots=True)
class InflightStep:
    """A launched step whose sampled tokens are still on their way to the host."""

    batch: ScheduledBatch
    sampled: list[Sequence]  # in row order of `tokens`
    tokens: torch.Tensor  # device
    rows: dict[int, int]  # seq_id -> row in `tokens`, for the next step's inputs
    host: Sampled  # the same rows in pinned host memory, valid once the read-back completes
    ticket: int  # read-back sequence number (readback.py)
    event: torch.cuda.Event | None = None  # under tensor parallelism, or with read-back by event


@dataclass(slots=True)
class StepRecord:
    phase: str
    finished: list[Sequence] = field(default_factory=list)
    new_tokens: list[tuple[Sequence, int]] = field(default_factory=list)


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


def stage(
    packed: torch.Tensor,
    seqs,
    src_rows: dict[int, int],
    block_size: int,
    owners: list[tuple[int, int, int]] | None = None,
) -> None:
    """Fill the packed host buffer for `seqs`; rows past them become padding that writes the null slot.

    `owners[r]` remembers whose block table row r holds (sequence id, table epoch, blocks written), so a buffer
    staged again for the same batch rewrites only the tables that grew: at batch 64 the table
    copies were most of the host's staging time.
    """
    arr = packed.numpy()
    n, width = len(seqs), packed.shape[1] - FIXED_COLUMNS
    arr[n:, :FIXED_COLUMNS] = (0, -1, 0, 0, 1)
    rows = []  # one pass, one row tuple in column order per sequence: this runs every decode step
    for seq in seqs:
        p = len(seq.prompt_ids) + len(seq.output_ids) + seq.num_pending - 1
        src = src_rows.get(seq.seq_id, -1) if seq.num_pending else -1
        token = -1 if src >= 0 else seq.token_at(p)
        rows.append((token, src, p, seq.block_table[p // block_size] * block_size + p % block_size, p + 1))
    if rows:
        arr[:n, :FIXED_COLUMNS] = rows
    for r, seq in enumerate(seqs):
        table = seq.block_table
        k = min(len(table), width)
        owner = (seq.seq_id, seq.table_epoch, k)
        if owners is not None and owners[r] == owner:
            continue
        # Entries past the live blocks are never read unmasked, so stale ones need no clearing.
        arr[r, FIXED_COLUMNS : FIXED_COLUMNS + k] = table[:k]
        if owners is not None:
            owners[r] = owner
    padding = (-1, 0, 0)
    if owners is None or any(owner != padding for owner in owners[n:]):
        arr[n:, FIXED_COLUMNS:] = 0
        if owners is not None:
            owners[n:] = [padding] * (len(owners) - n)
