"""A decoder layer's o_proj, residual add, MLP norm, gate_up_proj, SiLU-mul and down_proj for 1-16 decode
rows in one persistent launch: mlp_block.cu, compiled by NVRTC.

One block an SM streams the three weights through one ring of shared memory that never drains, so the
launches' ramps and tails between the five kernels it replaces go; grid barriers order the activations
between its phases (mlp_block.cu). The barrier needs every block resident at once, which one block an SM
and a grid of the SM count give, on a GPU this process has to itself.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from . import nvrtc

SOURCE = Path(__file__).with_name("mlp_block.cu")
MAX_ROWS = 16


_SHARED_LIMIT = 227 * 1024  # an H100's or H200's shared memory a block, dynamic and static


@dataclass(frozen=True, slots=True)
class Variant:
    """One build of mlp_block.cu: its macros."""

    row_tiles: int  # 8-row tiles of the decode rows
    warps: int = 8
    stages: int = 4  # slots of each warp's ring
    stamps: bool = False  # each block's clock at 7 points into an extra argument (bench/mlp_block.py)
    lines: bool = False  # the weights copied whole lines a warp-wide copy (LINES)

    def options(self) -> list[str]:
        stamps = ["-DSTAMPS=1"] if self.stamps else []
        lines = ["-DLINES=1"] if self.lines else []
        return [
            f"-DROW_TILES={self.row_tiles}", f"-DWARPS={self.warps}", f"-DSTAGES={self.stages}", *stamps, *lines
        ]  # fmt: skip

    @property
    def ring_bytes(self) -> int:
        """Dynamic shared memory: a slot holds 8 weight pieces and 4 x pieces a row tile, 16 bytes a lane each."""
        return self.warps * self.stages * (8 + 4 * self.row_tiles) * 32 * 16

    @property
    def shared_bytes(self) -> int:
        """The ring and the static arrays (the tile sums, 1/rms)."""
        return self.ring_bytes + 2 * self.warps * 8 * self.row_tiles * 32 * 4 + 64

    def fits_shared(self, limit: int = _SHARED_LIMIT) -> bool:
        return self.shared_bytes <= limit


# Warps a block at 1-8 rows; bench/mlp_block.py and bench/ab_step.py try 16 (two slots each, so the same
# bytes in flight an SM, with twice the warps issuing). 9-16 rows keep 8: 16 would not fit shared memory.
WARPS = 8
# The ring's weights copied whole 128-byte lines a warp-wide copy, as mma_gemv.LINES: the same bits, and
# 0-4% faster a layer alone (round 31, H100). FASTPATH_LINES=0 copies per lane.
LINES = os.environ.get("FASTPATH_LINES", "1") != "0"


def variant_for(
    m: int,
    stages: int | None = None,
    stamps: bool = False,
    warps: int | None = None,
    lines: bool | None = None,
) -> Variant:
    """4 slots a warp at 1-8 rows, 3 at 9-16 (whose slots are a third larger), 2 with 16 warps: what shared
    memory holds."""
    row_tiles = 1 if m <= 8 else 2
    warps = warps or (WARPS if row_tiles == 1 else 8)
    default = 2 if warps > 8 else 4 if row_tiles == 1 else 3
    lines = LINES if lines is None else lines
    return Variant(row_tiles=row_tiles, warps=warps, stages=stages or default, stamps=stamps, lines=lines)


def fits(attn, residual, o_weight, o_bias, norm_weight, gate_up_weight, down_weight) -> bool:
    """Whether this layer's second half runs here: CUDA, bf16, 1-16 rows, no o_proj bias, every tensor
    contiguous and 16-byte aligned, and Q and I multiples of 128 a warp, H of 64 a warp (with 8 warps, the
    1.24B and 8B Llamas)."""
    tensors = (attn, residual, o_weight, norm_weight, gate_up_weight, down_weight)
    if o_bias is not None or attn.dim() != 2 or residual.dim() != 2:
        return False
    m, q = attn.shape
    h = o_weight.shape[0]
    i = down_weight.shape[1]
    warps = variant_for(m).warps
    return (
        1 <= m <= MAX_ROWS
        and all(t.dtype == torch.bfloat16 and t.is_contiguous() and t.data_ptr() % 16 == 0 for t in tensors)
        # Every warp's share of K is whole groups of four 32-wide chunks (gate_up: two).
        and q % (128 * warps) == 0
        and h % (64 * warps) == 0
        and i % (128 * warps) == 0
        and residual.shape == (m, h)
        and o_weight.shape == (h, q)
        and norm_weight.shape == (h,)
        and gate_up_weight.shape == (2 * i, h)
        and down_weight.shape == (h, i)
        and attn.is_cuda
    )


def mlp_block(
    attn,
    residual,
    o_weight,
    norm_weight,
    eps: float,
    gate_up_weight,
    down_weight,
    arrivals,
    *,
    pdl: bool = False,
    stages: int | None = None,
    warps: int | None = None,
    stamps: torch.Tensor | None = None,
    lines: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(down_proj(silu(gate) * up of rms_norm(o + residual)), o + residual) with o = attn @ o_weight^T, for
    `fits` inputs. `arrivals`: a zeroed int64 on the device that only this call site uses (the grid
    barrier's count, which every launch leaves at a multiple of the grid). `stamps`: an int64 [grid, 7]
    for the stamped build's clocks (bench/mlp_block.py)."""
    m, q = attn.shape
    h, i = down_weight.shape
    device = attn.device
    summed = torch.empty(m, h, device=device, dtype=attn.dtype)
    act = torch.empty(m, i, device=device, dtype=attn.dtype)
    out = torch.empty(m, h, device=device, dtype=attn.dtype)
    squares = torch.empty(h // 16, 16, device=device, dtype=torch.float32)
    variant = variant_for(m, stages, stamps is not None, warps, lines)
    index = device.index or 0
    args = (
        attn, o_weight, residual, norm_weight, gate_up_weight, down_weight, summed, act, out, squares, arrivals,
        m, q, h, i, ctypes.c_float(eps), *(() if stamps is None else (stamps,)),
    )  # fmt: skip
    grid = (sms(index), 1, 1)
    stream = torch.cuda.current_stream(device)
    nvrtc.launch(
        _function(index, variant), grid, (variant.warps * 32, 1, 1), variant.ring_bytes, args, stream, pdl
    )
    return out, summed


@functools.cache
def sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def available(device_index: int) -> tuple[bool, str]:
    """Whether the kernel builds and loads on this device, and why not (for the engine's info)."""
    if not torch.cuda.is_available():
        return False, "no CUDA"
    if torch.cuda.get_device_capability(device_index) < (8, 0):
        return False, "needs compute capability 8.0 or newer (bf16 mma.sync)"
    # One block an SM holds the whole ring: Hopper's 227 KB a block, not an A100's 163 or a consumer card's 99.
    optin = getattr(torch.cuda.get_device_properties(device_index), "shared_memory_per_block_optin", 0)
    need = max(variant_for(m).shared_bytes for m in (8, 16))
    if optin < need:
        return False, f"needs {need // 1024} KB of shared memory a block; this GPU gives {optin // 1024} KB"
    try:
        _function(device_index, variant_for(8))
    except (OSError, RuntimeError, AttributeError) as e:  # no NVRTC, a failed build, an old driver
        return False, f"NVRTC: {e}"
    return True, "on"


@functools.cache  # a launch's lookup: the options are built once a variant
def _function(device_index: int, variant: Variant) -> ctypes.c_void_p:
    return nvrtc.kernel(device_index, SOURCE, "mlp_block", tuple(variant.options()), variant.ring_bytes)
