"""A decode step's packed inputs placed in the step's buffers in one launch (see runner/decode_inputs.py).

Token ids (the previous step's device tokens where the host does not know them yet), positions,
slot mapping, context lengths and block-table rows; with `embed`, the embedding lookup as well (a
tensor-parallel rank's slice of the vocabulary: zeros for ids outside it, which the all-reduce fills).
The native prologue and the FusedDecodePrologue hook both launch it, through
runner/decode_inputs.py, which owns the packing's columns.
"""

from __future__ import annotations

import torch

_kernel = None


def load_kernel():
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit
    def decode_unpack_kernel(
        packed_ptr, prev_ptr, embed_ptr, ids_ptr, pos_ptr, slot_ptr, ctx_ptr, table_ptr, embeds_ptr,
        stride_packed, stride_table, stride_embed, stride_embeds, width, hidden, vocab_start, vocab_size,
        HAS_PREV: tl.constexpr, HAS_EMBEDS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_H: tl.constexpr,
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
        if HAS_EMBEDS:
            local = token - vocab_start
            mine = (local >= 0) & (local < vocab_size)
            local = tl.where(mine, local, 0)
            for h0 in range(0, hidden, BLOCK_H):
                h = h0 + tl.arange(0, BLOCK_H)
                vec = tl.load(embed_ptr + local * stride_embed + h, mask=h < hidden)
                tl.store(embeds_ptr + r * stride_embeds + h, tl.where(mine, vec, 0.0), mask=h < hidden)

    _kernel = decode_unpack_kernel
    return _kernel


def unpack(
    packed: torch.Tensor,
    prev: torch.Tensor | None,
    out: tuple[torch.Tensor, ...],
    columns: tuple[int, ...],
    embed: torch.nn.Module | None = None,
) -> None:
    """`packed` [rows, columns] on the device into `out` = (ids, positions, slots, context lens, block
    tables, embeds or None); `columns` = (token, source row, position, slot, context length, first
    table column). With `embed` (a VocabParallelEmbedding), also this rank's embeddings of the ids."""
    ids, positions, slots, lens, tables, embeds = out
    rows, width = tables.shape
    weight = embed.weight if embed is not None else positions  # an unread placeholder pointer
    hidden = weight.shape[1] if embed is not None else 1
    embeds = embeds if embed is not None else positions
    c_token, c_src, c_pos, c_slot, c_ctx, c_fixed = columns
    load_kernel()[(rows,)](
        packed, prev if prev is not None else ids, weight, ids, positions, slots, lens, tables, embeds,
        packed.stride(0), tables.stride(0), weight.stride(0), embeds.stride(0), width, hidden,
        embed.start if embed is not None else 0, embed.size if embed is not None else 0,
        HAS_PREV=prev is not None, HAS_EMBEDS=embed is not None,
        BLOCK_W=min(1024, _next_pow2(width)), BLOCK_H=min(2048, _next_pow2(hidden)),
        C_TOKEN=c_token, C_SRC=c_src, C_POS=c_pos, C_SLOT=c_slot, C_CTX=c_ctx, C_FIXED=c_fixed,
    )  # fmt: skip


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
