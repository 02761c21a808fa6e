"""A decode step's inputs: staged on the host in one packed pinned buffer, then placed on the device.

The engine stages the buffer (engine/steps.py `stage`); a prologue places it.

The packing is shared by both prologues. On CUDA the native one copies it and unpacks it in one
launch (kernels/decode_unpack.py), gathering the previous step's tokens; elsewhere it slices it with
a launch per field. `FusedDecodePrologue` adds the embedding lookup to the same launch.
"""

from __future__ import annotations

import importlib.util
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


# A module-level switch, so bench/ab_step.py can compare the two in one process.
UNPACK_IN_ONE_LAUNCH = importlib.util.find_spec("triton") is not None


def native_prologue(inputs: DecodeInputs, embed) -> None:
    """The reference prologue: one copy, then one launch on CUDA, else a launch per field.

    Every launch here runs between two graph replays, on the step's critical path."""
    b = inputs.buffers
    dev = inputs.packed.to(b.input_ids.device, non_blocking=True)
    if b.input_ids.is_cuda and UNPACK_IN_ONE_LAUNCH:
        unpack_in_one_launch(inputs, dev)
    else:
        _unpack_per_field(inputs, dev)
    if b.embeds is not None:
        b.embeds.copy_(embed(b.input_ids))


def unpack_in_one_launch(inputs: DecodeInputs, packed: torch.Tensor, embed=None) -> None:
    """`packed` (inputs.packed on the device) into the buffers in one Triton launch; with `embed` (a
    VocabParallelEmbedding), the embeddings too."""
    from ..kernels.decode_unpack import unpack

    b = inputs.buffers
    out = (b.input_ids, b.positions, b.slot_mapping, b.context_lens, b.block_tables, b.embeds)
    unpack(
        packed, inputs.prev_tokens, out, (TOKEN, SRC_ROW, POSITION, SLOT, CONTEXT_LEN, FIXED_COLUMNS), embed
    )


def _unpack_per_field(inputs: DecodeInputs, dev: torch.Tensor) -> None:
    b = inputs.buffers
    ids = dev[:, TOKEN]
    if inputs.prev_tokens is not None:
        src = dev[:, SRC_ROW]
        ids = torch.where(src >= 0, inputs.prev_tokens[src.clamp_min(0)], ids)
    b.input_ids.copy_(ids)
    b.positions.copy_(dev[:, POSITION])
    b.slot_mapping.copy_(dev[:, SLOT])
    b.context_lens.copy_(dev[:, CONTEXT_LEN])
    b.block_tables.copy_(dev[:, FIXED_COLUMNS:])
