"""guided_mask.py's definition in two Triton kernels: one masks a step's logits in place and says,
per block of tokens, whether a finite logit that is not a stop token is left; the second lifts
min_tokens from those answers (the general sampler's rows only)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .guided_mask import guided_mask_reference
from .sampling import BIAS_BIT, STOP_BIT

_STOP_BIT = tl.constexpr(STOP_BIT)  # a kernel reads only constexpr globals
_BIAS_BIT = tl.constexpr(BIAS_BIT)


@triton.jit
def guided_mask_kernel(
    logits_ptr, stride_l, mask_ptr, stride_m, flags_ptr, params_ptr, stride_p, entries_ptr, stride_e,
    other_ptr, vocab, SLOTS_COL: tl.constexpr, HAS_PARAMS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Program (r, b): tokens [b * BLOCK, (b + 1) * BLOCK) of row r. A constrained row's forbidden
    tokens go to -inf in place; with params, other[r, b] says whether the block holds a finite logit
    that is not a stop token of the row nor banned by its biases (-inf, half the entry row on)."""
    r = tl.program_id(0)
    b = tl.program_id(1)
    cols = b * BLOCK + tl.arange(0, BLOCK)
    inside = cols < vocab
    x = tl.load(logits_ptr + r * stride_l + cols, mask=inside, other=float("-inf"))
    if tl.load(flags_ptr + r) != 0:
        words = tl.load(mask_ptr + r * stride_m + cols // 32, mask=inside, other=0)
        allowed = ((words >> (cols % 32)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
        tl.store(logits_ptr + r * stride_l + cols, x, mask=inside & ~allowed)
    if HAS_PARAMS:
        slot = tl.load(params_ptr + r * stride_p + SLOTS_COL)
        row_e = entries_ptr + slot * stride_e
        entry = tl.load(row_e + cols, mask=inside, other=0)
        biased = (entry & _BIAS_BIT) != 0
        bias = tl.load(row_e + (stride_e >> 1) + cols, mask=inside & biased, other=0).to(
            tl.float32, bitcast=True
        )
        banned = biased & (bias == float("-inf"))
        ok = (x > float("-inf")) & ((entry & _STOP_BIT) == 0) & ~banned & inside
        tl.store(other_ptr + r * tl.num_programs(1) + b, tl.max(ok.to(tl.int32), 0))


@triton.jit
def lift_min_tokens_kernel(
    params_ptr, out_ptr, other_ptr, n, blocks, FIELDS: tl.constexpr, MIN_TOKENS_COL: tl.constexpr,
    FIELDS_POW2: tl.constexpr, BLOCKS_POW2: tl.constexpr,
):  # fmt: skip
    """Row r of params copied to out, min_tokens set to 0 in rows r < n whose blocks all said no."""
    r = tl.program_id(0)
    fields = tl.arange(0, FIELDS_POW2)
    row = tl.load(params_ptr + r * FIELDS + fields, mask=fields < FIELDS, other=0)
    if r < n:
        parts = tl.arange(0, BLOCKS_POW2)
        other = tl.max(tl.load(other_ptr + r * blocks + parts, mask=parts < blocks, other=0), 0)
        row = tl.where((fields == MIN_TOKENS_COL) & (other == 0), 0, row)
    tl.store(out_ptr + r * FIELDS + fields, row, mask=fields < FIELDS)


BLOCK = 4096


def guided_mask(
    logits: torch.Tensor,
    mask: torch.Tensor,
    flags: torch.Tensor,
    params: torch.Tensor | None = None,
    entries: torch.Tensor | None = None,
    slots_col: int = 0,
    min_tokens_col: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """guided_mask_reference's result through the kernels. The logits are masked in place (the
    reference returns a copy); inputs the kernels cannot take as they are go to the reference."""
    n, vocab = logits.shape
    if n == 0 or not _kernel_shaped(logits, mask, flags, params, entries):
        return guided_mask_reference(logits, mask, flags, params, entries, slots_col, min_tokens_col)
    blocks = triton.cdiv(vocab, BLOCK)
    has_params = params is not None
    if has_params:
        other = torch.empty(n, blocks, dtype=torch.int32, device=logits.device)
    else:
        params = entries = other = flags  # never read
    guided_mask_kernel[(n, blocks)](
        logits,
        logits.stride(0),
        mask,
        mask.stride(0),
        flags,
        params,
        params.stride(0),
        entries,
        entries.stride(0),
        other,
        vocab,
        SLOTS_COL=slots_col,
        HAS_PARAMS=has_params,
        BLOCK=BLOCK,
    )
    if not has_params:
        return logits, None
    out = torch.empty_like(params)
    fields = params.shape[1]
    lift_min_tokens_kernel[(params.shape[0],)](
        params,
        out,
        other,
        n,
        blocks,
        FIELDS=fields,
        MIN_TOKENS_COL=min_tokens_col,
        FIELDS_POW2=triton.next_power_of_2(fields),
        BLOCKS_POW2=triton.next_power_of_2(blocks),
    )
    return logits, out


def _kernel_shaped(logits, mask, flags, params, entries) -> bool:
    """Whether the kernels can read these as they index them: unit-stride rows, a mask word for every
    token and a mask row and flag for every logits row, int32 where they read int32. Shapes and
    strides only, no device sync, so it is safe inside a graph capture."""
    n, vocab = logits.shape
    ok = (
        logits.stride(1) == 1
        and mask.dim() == 2
        and mask.stride(1) == 1
        and mask.dtype == torch.int32
        and mask.shape[0] >= n
        and mask.shape[1] * 32 >= vocab
        and flags.dim() == 1
        and flags.is_contiguous()
        and flags.dtype == torch.int32
        and flags.numel() >= n
    )
    if params is not None:
        ok = ok and params.dim() == 2 and params.is_contiguous() and params.shape[0] >= n
        ok = ok and entries.dim() == 2 and entries.stride(1) == 1 and entries.dtype == torch.int32
        ok = ok and entries.shape[1] >= vocab
    return ok
