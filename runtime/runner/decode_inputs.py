"""A decode step's inputs: staged on the host in one packed pinned buffer, then placed on the device.

The engine stages the buffer (engine/steps.py `stage`); a prologue places it.

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
