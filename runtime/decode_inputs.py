"""A decode step's inputs: staged on the host in one packed pinned buffer, then placed on the device.

The packing is shared by both prologues: the native one copies and slices it (several launches);
`FusedDecodePrologue` unpacks it, gathers the previous step's tokens and embeds them in one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Columns of the packed host buffer, then the block-table row.
TOKEN, SRC_ROW, POSITION, SLOT, CONTEXT_LEN = range(5)
FIXED_COLUMNS = 5


@dataclass(slots=True)
class DecodeBuffers:
    """Device destinations of a decode step; a graph's static buffers, or fresh ones for an eager step."""

    input_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64
    slot_mapping: torch.Tensor  # [B] int64
    context_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, W] int32
    embeds: torch.Tensor | None  # [B, H] when the step starts from embeddings (a prologue hook is set)

    @classmethod
    def allocate(cls, rows: int, width: int, hidden: int | None, dtype: torch.dtype, device: torch.device):
        return cls(
            torch.zeros(rows, dtype=torch.int64, device=device),
            torch.zeros(rows, dtype=torch.int64, device=device),
            torch.zeros(rows, dtype=torch.int64, device=device),
            torch.ones(rows, dtype=torch.int32, device=device),
            torch.zeros(rows, width, dtype=torch.int32, device=device),
            None if hidden is None else torch.zeros(rows, hidden, dtype=dtype, device=device),
        )


@dataclass(slots=True)
class DecodeInputs:
    """What a prologue receives: the staged host data, where it must go, and the previous step's tokens."""

    num_seqs: int  # live rows; rows past this are graph padding
    packed: torch.Tensor  # [rows, FIXED_COLUMNS + W] int64, pinned on CUDA
    buffers: DecodeBuffers
    prev_tokens: torch.Tensor | None  # [R] int64 on the device, rows named by SRC_ROW


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
    pos = [seq.num_tokens - 1 for seq in seqs]
    src = [src_rows.get(seq.seq_id, -1) if seq.num_pending else -1 for seq in seqs]
    fixed = arr[:n, :FIXED_COLUMNS]
    fixed[:, TOKEN] = [-1 if s >= 0 else seq.token_at(p) for seq, p, s in zip(seqs, pos, src, strict=True)]
    fixed[:, SRC_ROW] = src
    fixed[:, POSITION] = pos
    fixed[:, SLOT] = [
        seq.block_table[p // block_size] * block_size + p % block_size
        for seq, p in zip(seqs, pos, strict=True)
    ]
    fixed[:, CONTEXT_LEN] = [p + 1 for p in pos]
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


def native_prologue(inputs: DecodeInputs, embed) -> None:
    """The reference prologue: one copy, then a launch per field."""
    b = inputs.buffers
    dev = inputs.packed.to(b.input_ids.device, non_blocking=True)
    ids = dev[:, TOKEN]
    if inputs.prev_tokens is not None:
        src = dev[:, SRC_ROW]
        ids = torch.where(src >= 0, inputs.prev_tokens[src.clamp_min(0)], ids)
    b.input_ids.copy_(ids)
    b.positions.copy_(dev[:, POSITION])
    b.slot_mapping.copy_(dev[:, SLOT])
    b.context_lens.copy_(dev[:, CONTEXT_LEN])
    b.block_tables.copy_(dev[:, FIXED_COLUMNS:])
    if b.embeds is not None:
        b.embeds.copy_(embed(b.input_ids))
