"""A projection's LoRA deltas in two Triton launches: the shrink and the expand.

`out += (x @ A_all, other slots' columns zeroed) @ B_all` (model/lora_table.py has the layout). As three
torch ops (matmul, fill, addmm) this cost 195 launches a decode step and +70% at batch 8 on the H100
(docs/performance.md, round 27): cuBLAS runs the shrink's [M, K] @ [K, slots * W] on a handful of
blocks, and none of the three joins the step's programmatic-dependent-launch chain.

- **Shrink**: program (m, s) multiplies BLOCK_M rows of x by the s-th of SPLIT ranges of A's K rows and
  writes its fp32 partial; the last program of a row block to arrive sums the partials in split order
  (deterministic whatever finished first), zeroes each row's other slots' columns by a select (another
  slot's inf times a mask's 0 would be NaN), rounds to the model dtype as the torch matmul rounds, and
  resets its arrival count for the next launch or graph replay.
- **Expand**: program (m, n) adds the shrunk rows times B's BLOCK_N columns onto `out`, in place, summed
  in fp32 and rounded once as addmm rounds. A row with no adapter (slot -1) adds exact zeros, so it
  keeps `out`'s bits.

SPLIT and the blocks depend on K and the table's width only, never on M, so a row's bits do not
depend on the rows beside it or on the batch size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_kernels import _release, _wait

BLOCK_M = 16
BLOCK_K = 64
MAX_SPLIT = 16
MAX_COLUMNS = 256  # slots * W past this take the torch path: the shrink's tile lives in registers
MAX_ROWS = 512  # past this (long prefills) cuBLAS's GEMMs win, and the partials would grow with M


def split_of(k: int) -> int:
    return min(MAX_SPLIT, triton.cdiv(k, BLOCK_K))


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    # fp32 tables (tests, float32 models) stay fp32: Triton's default for fp32 inputs is TF32.
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def lora_shrink_kernel(
    x_ptr, a_ptr, slots_ptr, part_ptr, count_ptr, s_ptr, M, K, COLS, W, stride_x, stride_a,
    SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
    IEEE: tl.constexpr, USE_PDL: tl.constexpr = False,
):  # fmt: skip
    pid_m, pid_s = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rc = tl.arange(0, BLOCK_C)
    m_mask, c_mask = rm < M, rc < COLS
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT) * BLOCK_K
    k_lo = pid_s * per
    k_hi = tl.minimum(K, k_lo + per)
    _release(USE_PDL)
    _wait(USE_PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < k_hi
        x = tl.load(
            x_ptr + rm[:, None] * stride_x + rk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0
        )
        a = tl.load(
            a_ptr + rk[:, None] * stride_a + rc[None, :], mask=k_mask[:, None] & c_mask[None, :], other=0.0
        )
        acc = _dot(x, a, acc, IEEE)
    tile = rm[:, None] * BLOCK_C + rc[None, :]
    tl.store(part_ptr + pid_s * M * BLOCK_C + tile, acc, mask=m_mask[:, None])
    # Every thread's partial is stored before the one release that counts this program in.
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr + pid_m, 1, sem="acq_rel")
    if arrived == SPLIT - 1:
        acc = tl.load(part_ptr + tile, mask=m_mask[:, None], other=0.0, cache_modifier=".cg")
        for s in range(1, SPLIT):
            acc += tl.load(
                part_ptr + s * M * BLOCK_C + tile, mask=m_mask[:, None], other=0.0, cache_modifier=".cg"
            )
        tl.atomic_xchg(count_ptr + pid_m, 0)
        slot = tl.load(slots_ptr + rm, mask=m_mask, other=-1)
        acc = tl.where(rc[None, :] // W == slot[:, None], acc, 0.0)
        tl.store(s_ptr + tile, acc.to(s_ptr.dtype.element_ty), mask=m_mask[:, None])


@triton.jit
def lora_expand_kernel(
    s_ptr, b_ptr, out_ptr, M, N, COLS, stride_b, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, IEEE: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.arange(0, BLOCK_C)
    m_mask, n_mask = rm < M, rn < N
    # B is a weight: no kernel of the chain writes it, so it is read before the wait.
    b = tl.load(
        b_ptr + rc[:, None] * stride_b + rn[None, :], mask=(rc < COLS)[:, None] & n_mask[None, :], other=0.0
    )
    _release(USE_PDL)
    _wait(USE_PDL)
    s = tl.load(s_ptr + rm[:, None] * BLOCK_C + rc[None, :], mask=m_mask[:, None], other=0.0)
    out_mask = m_mask[:, None] & n_mask[None, :]
    o = tl.load(out_ptr + rm[:, None] * stride_o + rn[None, :], mask=out_mask, other=0.0)
    acc = _dot(s, b, o.to(tl.float32), IEEE)
    tl.store(out_ptr + rm[:, None] * stride_o + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def fits(x: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether the two kernels take this call (else the torch ops do)."""
    return x.shape[0] <= MAX_ROWS and a.shape[1] <= MAX_COLUMNS and x.dtype == a.dtype


def lora_add(x, out, a, b, slots, width: int, counts: torch.Tensor, pdl: dict) -> torch.Tensor:
    """`out` (written in place and returned) plus the deltas of rows `x` [M, K] through A [K, C] and
    B [C, N], row i on slot `slots[i]` (-1: none). `counts`: int32 zeros, one per BLOCK_M rows of M,
    this call site's own (the last program of each row block sets its count back to zero)."""
    m, k = x.shape
    cols, n = b.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    block_c = max(16, triton.next_power_of_2(cols))
    split = split_of(k)
    blocks = triton.cdiv(m, BLOCK_M)
    if counts.numel() < blocks:
        raise ValueError(f"{counts.numel()} arrival counts for {blocks} row blocks")
    parts = torch.empty(split * m * block_c, device=x.device, dtype=torch.float32)
    shrunk = torch.empty(m, block_c, device=x.device, dtype=x.dtype)
    ieee = x.dtype == torch.float32
    lora_shrink_kernel[(blocks, split)](
        x, a, slots, parts, counts, shrunk, m, k, cols, width, x.stride(0), a.stride(0),
        SPLIT=split, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_C=block_c, IEEE=ieee, num_warps=4, **pdl,
    )  # fmt: skip
    block_n = 128 if block_c <= 64 else 64
    lora_expand_kernel[(blocks, triton.cdiv(n, block_n))](
        shrunk, b, out, m, n, cols, b.stride(0), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_C=block_c, IEEE=ieee, num_warps=4, **pdl,
    )  # fmt: skip
    return out
