"""Reference decode_prologue hooks.

`FusedDecodePrologue` does a decode step's whole input prologue in one Triton launch: token ids
(taken from the previous step's device tokens where the host does not know them yet), positions,
slot mapping, context lengths, block-table rows, and the embedding lookup. On CPU it declines.
Under tensor parallelism the lookup is this rank's share (zeros for ids outside its vocabulary
slice); the forward sums the shares.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from .runner.decode_inputs import CONTEXT_LEN, FIXED_COLUMNS, POSITION, SLOT, SRC_ROW, TOKEN, DecodeInputs

if TYPE_CHECKING:
    from .engine.executor import ExecutorCore

_kernel = None


def _load_kernel():
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit
    def prologue_kernel(
        packed_ptr, prev_ptr, embed_ptr, ids_ptr, pos_ptr, slot_ptr, ctx_ptr, table_ptr, embeds_ptr,
        stride_packed, stride_table, stride_embed, stride_embeds, width, hidden, vocab_start, vocab_size,
        HAS_PREV: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_H: tl.constexpr,
        C_TOKEN: tl.constexpr, C_SRC: tl.constexpr, C_POS: tl.constexpr, C_SLOT: tl.constexpr,
        C_CTX: tl.constexpr, C_FIXED: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0)
        row = packed_ptr + r * stride_packed
        token = tl.load(row + C_TOKEN)
        if HAS_PREV:
            src = tl.load(row + C_SRC)
            prev = tl.load(prev_ptr + tl.maximum(src, 0))
            token = tl.where(src >= 0, prev, token)
        tl.store(ids_ptr + r, token)
        tl.store(pos_ptr + r, tl.load(row + C_POS))
        tl.store(slot_ptr + r, tl.load(row + C_SLOT))
        tl.store(ctx_ptr + r, tl.load(row + C_CTX).to(tl.int32))
        for w0 in range(0, width, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            entries = tl.load(row + C_FIXED + w, mask=w < width, other=0)
            tl.store(table_ptr + r * stride_table + w, entries.to(tl.int32), mask=w < width)
        local = token - vocab_start
        mine = (local >= 0) & (local < vocab_size)
        local = tl.where(mine, local, 0)
        for h0 in range(0, hidden, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            vec = tl.load(embed_ptr + local * stride_embed + h, mask=h < hidden)
            tl.store(embeds_ptr + r * stride_embeds + h, tl.where(mine, vec, 0.0), mask=h < hidden)

    _kernel = prologue_kernel
    return _kernel


class FusedDecodePrologue:
    """decode_prologue hook: one launch on CUDA; declines elsewhere so the native prologue runs."""

    def __init__(self) -> None:
        self.available = importlib.util.find_spec("triton") is not None

    def __call__(self, executor: ExecutorCore, inputs: DecodeInputs) -> bool:
        b = inputs.buffers
        if not (self.available and executor.is_cuda and b.embeds is not None):
            return False
        kernel = _load_kernel()
        packed = inputs.packed.to(executor.device, non_blocking=True)
        rows, width = b.block_tables.shape
        embed = executor.model.embed_tokens
        weight = embed.weight
        prev = inputs.prev_tokens if inputs.prev_tokens is not None else b.input_ids
        kernel[(rows,)](
            packed, prev, weight, b.input_ids, b.positions, b.slot_mapping, b.context_lens, b.block_tables, b.embeds,
            packed.stride(0), b.block_tables.stride(0), weight.stride(0), b.embeds.stride(0), width, weight.shape[1],
            embed.start, embed.size,
            HAS_PREV=inputs.prev_tokens is not None,
            BLOCK_W=min(1024, triton_next_pow2(width)), BLOCK_H=min(2048, triton_next_pow2(weight.shape[1])),
            C_TOKEN=TOKEN, C_SRC=SRC_ROW, C_POS=POSITION, C_SLOT=SLOT, C_CTX=CONTEXT_LEN, C_FIXED=FIXED_COLUMNS,
        )  # fmt: skip
        return True


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
