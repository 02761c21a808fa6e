"""Linears at 2-16 rows on the tensor cores, streamed as a GEMV: mma_gemv.cu, compiled by NVRTC.

The kernel is CUDA C++ because what makes it fast cannot be said in Triton: each warp streams its rows of
the weight through its own ring in shared memory, whole 128-byte lines a copy, and each lane reads back the
16-byte pieces that make its mma.sync A fragments, in an order of K both operands share (mma_gemv.cu).
NVRTC builds it once a process for each variant (rows, gate, bias, warps, chunks in flight); the
launch goes through the driver's cuLaunchKernelEx, with programmatic dependent launch where the
engine's Triton kernels have it, so CUDA graphs capture it like any kernel.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import nvrtc

SOURCE = Path(__file__).with_name("mma_gemv.cu")
MAX_ROWS = 16
# The largest weight it takes, in elements. On the 1.24B Llama at 8 and 16 rows (bench/linear.py, round
# 22) it beat cuBLAS and the small-M Triton kernel on q|k|v, o_proj and down_proj (down_proj's 16.8M
# elements the largest), and lost on gate_up_proj (33.5M; 21.1 against cuBLAS and the SiLU-mul's 20.0 µs)
# and the LM head (165 against 124 µs): over many rows of tiles its short blocks, each with its own ramp
# and closing barrier, fall behind cuBLAS's pipelined tiles, where one pass of a small matrix's blocks,
# its whole weight requested at once, comes out ahead.
MAX_WEIGHT = 1 << 24
# The gated build (silu(gate) * up) for gate_up_proj too (33.5M elements): one launch where cuBLAS and the
# SiLU-mul take two, and the chain under programmatic dependent launch unbroken (cuBLAS's kernels break
# it). With two chunks a slot, two slots and the ring filled by whole lines (below) it is also faster alone
# than cuBLAS and the SiLU-mul (round 31's `linear`, H100: 25.6 against 27.7 µs at 8 rows), and the step at
# 8 rows 65 µs faster (`ab-lines`). FASTPATH_MMA_GATED=0 keeps gate_up_proj on cuBLAS.
# Smaller gated weights (up to MAX_WEIGHT) take the gated build either way; =0 gives them round 22's ring.
_GATED = os.environ.get("FASTPATH_MMA_GATED", "1") != "0"
GATED_MAX_WEIGHT = 1 << 26 if _GATED else MAX_WEIGHT
GATED_UNROLL, GATED_STAGES = (2, 2) if _GATED else (1, 4)
# The plain builds' ring: four slots of two chunks (64 KB a block at 8 warps). Alone, two slots ran a few
# percent faster (round 31's `linear`), but in the step they lost 45 and 52 µs at 2 and 4 rows and were
# within 5 µs at 8 and 16 (`ab-lines`, call 3, H100).
PLAIN_UNROLL, PLAIN_STAGES = 2, 4
# Whole 128-byte lines a warp-wide copy (mma_gemv.cu's LINES): the same products in the same order, so the
# same bits, from copies that each cover 4 rows' segments instead of 8 rows' half lines; 2-14% faster alone
# on the large weights (round 31). FASTPATH_LINES=0 fills the ring per lane, as rounds 22-30 did.
LINES = os.environ.get("FASTPATH_LINES", "1") != "0"


@dataclass(frozen=True, slots=True)
class Variant:
    """One build of mma_gemv.cu: its macros."""

    row_tiles: int  # 8-row tiles of x
    gated: bool
    has_bias: bool
    warps: int
    unroll: int  # 32-wide chunks of K a slot of a warp's ring holds
    stages: int  # slots of the ring
    rope_dim: int = 0  # q|k|v with RoPE and the cache write in the epilogue, heads of this size; 0: off
    lines: bool = False  # the ring filled by whole lines (LINES)

    def options(self) -> list[str]:
        rope = ["-DROPE=1", f"-DHEAD_DIM={self.rope_dim}"] if self.rope_dim else []
        lines = ["-DLINES=1"] if self.lines else []
        return [
            f"-DROW_TILES={self.row_tiles}",
            f"-DGATED={int(self.gated)}",
            f"-DHAS_BIAS={int(self.has_bias)}",
            f"-DWARPS={self.warps}",
            f"-DUNROLL={self.unroll}",
            f"-DSTAGES={self.stages}",
            *rope,
            *lines,
        ]

    @property
    def ring_bytes(self) -> int:
        """Dynamic shared memory: each lane's 16-byte pieces of 2 rows (4 gated) a chunk, every slot."""
        return self.warps * self.stages * self.unroll * (4 if self.gated else 2) * 32 * 16


def variant_for(
    m: int,
    k: int,
    gated: bool,
    has_bias: bool,
    warps: int | None = None,
    unroll: int | None = None,
    stages: int | None = None,
    rope_dim: int = 0,
    lines: bool | None = None,
) -> Variant:
    """The build an m-row linear over K columns launches: 8 warps a block up to K = 4096, then 16, so
    each warp streams 8-16 chunks of 32 columns; 8 chunks in flight a warp (four slots of two; gated, whose
    chunks are twice the bytes, two slots of two), 64 KB of ring a block at 8 warps."""
    return Variant(
        row_tiles=1 if m <= 8 else 2,
        gated=gated,
        has_bias=has_bias,
        warps=warps or (8 if k <= 4096 else 16),
        unroll=unroll or (GATED_UNROLL if gated else PLAIN_UNROLL),
        stages=stages or (GATED_STAGES if gated else PLAIN_STAGES),
        rope_dim=rope_dim,
        lines=LINES if lines is None else lines,
    )


def fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated: bool = False) -> bool:
    """Whether x @ weight^T runs here: bf16, 2-16 rows, a weight of at most MAX_WEIGHT elements
    (GATED_MAX_WEIGHT gated), K a multiple of 8 and rows 16-byte aligned (the kernel's copies are 16
    bytes wide)."""
    m, k = x.shape
    return (
        x.is_cuda
        and 2 <= m <= MAX_ROWS
        and weight.numel() <= (GATED_MAX_WEIGHT if gated else MAX_WEIGHT)
        and x.dtype == weight.dtype == torch.bfloat16
        and (bias is None or (bias.dtype == torch.bfloat16 and bias.is_contiguous()))
        and weight.shape[1] == k
        and k % 8 == 0
        and x.stride(1) == 1
        and weight.stride(1) == 1
        and x.stride(0) % 8 == 0
        and weight.stride(0) % 8 == 0
        and x.data_ptr() % 16 == 0
        and weight.data_ptr() % 16 == 0
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    gated: bool = False,
    pdl: bool = False,
    warps: int | None = None,
    unroll: int | None = None,
    stages: int | None = None,
    lines: bool | None = None,
) -> torch.Tensor:
    """x @ weight^T (+ bias), or with `gated` silu(gate) * up of weight's two halves, for `fits` inputs."""
    m, k = x.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    variant = variant_for(m, k, gated, bias is not None, warps, unroll, stages, lines=lines)
    _run(variant, x, weight, bias, y, n, y.stride(0), pdl)
    return y


def _run(
    variant: Variant, x, weight, bias, out, n: int, stride_out: int, pdl: bool, extra: tuple = ()
) -> None:
    """Launch `variant` over n output rows, 16 a block: the arguments every build takes, then `extra`
    (the ROPE build's)."""
    m, k = x.shape
    args = (
        x,
        weight,
        bias if bias is not None else weight,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        stride_out,
    )
    grid, block = (-(-n // 16), 1, 1), (variant.warps * 32, 1, 1)
    function = _function(x.device.index or 0, variant)
    stream = torch.cuda.current_stream(x.device)
    nvrtc.launch(function, grid, block, variant.ring_bytes, (*args, *extra), stream, pdl)


def fits_rope(x, weight, bias, positions, slots, cos, sin, k_cache, v_cache, shape) -> bool:
    """Whether `linear_rope_cache` takes this q|k|v projection: `fits`, heads of a multiple of 16
    elements, the weight exactly the heads' rows, int64 positions and slots, an fp32 table and bf16
    caches laid out [slots, kv_heads, dim]."""
    heads, kv_heads, dim = shape
    return (
        fits(x, weight, bias)
        and dim % 16 == 0
        and weight.shape[0] == (heads + 2 * kv_heads) * dim
        and positions.dtype == slots.dtype == torch.int64
        and positions.is_contiguous()
        and slots.is_contiguous()
        and cos.dtype == sin.dtype == torch.float32
        and cos.stride() == sin.stride()
        and cos.stride(1) == 1
        and k_cache.dtype == v_cache.dtype == torch.bfloat16
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    )


def linear_rope_cache(
    x, weight, bias, positions, slots, cos, sin, k_cache, v_cache, shape, *, pdl: bool = False
) -> torch.Tensor:
    """q of the q|k|v projection of x with RoPE applied, k (rotated) and v written into the paged
    caches at `slots`: mma_gemv.linear then TritonOps.qkv_rope_cache in one launch, rounded as those
    two round (the projection, each RoPE product, their sum). For `fits_rope` inputs; returns
    [M, heads, dim]."""
    heads, kv_heads, dim = shape
    m, k = x.shape
    q = torch.empty(m, heads, dim, device=x.device, dtype=x.dtype)
    variant = variant_for(m, k, False, bias is not None, rope_dim=dim)
    extra = (positions, slots, cos, sin, cos.stride(0), k_cache, v_cache, heads, kv_heads)
    _run(variant, x, weight, bias, q, weight.shape[0], heads * dim, pdl, extra)
    return q


@functools.cache
def available(device_index: int) -> tuple[bool, str]:
    """Whether the kernel builds and loads on this device, and why not (for the engine's info)."""
    if not torch.cuda.is_available():
        return False, "no CUDA"
    if torch.cuda.get_device_capability(device_index) < (8, 0):
        return False, "needs compute capability 8.0 or newer (bf16 mma.sync)"
    try:
        _function(device_index, variant_for(8, 4096, False, False))
    except (OSError, RuntimeError, AttributeError) as e:  # no NVRTC, a failed build, an old driver
        return False, f"NVRTC: {e}"
    return True, "on"


@functools.cache  # a launch's lookup: the options are built once a variant
def _function(device_index: int, variant: Variant) -> ctypes.c_void_p:
    # Past 48 KB of dynamic shared memory a kernel has to ask for it.
    return nvrtc.kernel(device_index, SOURCE, "mma_gemv", tuple(variant.options()), variant.ring_bytes)
