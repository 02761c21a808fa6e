"""Weights pulled into L2 ahead of the linears that read them: l2_prefetch.cu, compiled by NVRTC.

A decode step's attention, norms and RoPE read little from HBM at short contexts, and each linear
after them starts its weight stream cold: its first wave waits a full HBM latency, and a small weight
(o_proj's 8 MB) is over before the stream reaches copy bandwidth. TritonOps.prefetch_l2 launches this
kernel on a side stream once q|k|v is written, so a branch of the step's graph asks for o_proj's weight
and the front of gate_up's while attention runs. It is only a hint: no result depends on it, and the
step joins the branch at its end.

Off unless FASTPATH_L2_PREFETCH_MB is set (bench/ab_step.py times it first); the budget is the bytes a
layer asks for, at most the device's L2.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from . import nvrtc

SOURCE = Path(__file__).with_name("l2_prefetch.cu")
RANGES = 4  # l2_prefetch.cu's ranges a launch
BLOCKS = 64  # one warp each: requests from 64 SMs' copy engines at once
BUDGET_BYTES = int(float(os.environ.get("FASTPATH_L2_PREFETCH_MB", "0")) * (1 << 20))
MAX_ROWS = 256  # decode-sized steps only: a prefill's linears are bound by their products, not the stream


def plan(groups: Sequence[Sequence[torch.Tensor]], budget: int) -> list[tuple[int, int]]:
    """(address, bytes) of the ranges to ask for: `groups` in turn, the tensors of a group sharing what
    is left of `budget` equally (gate and up, read side by side), each from its start. Every range is a
    multiple of 16 bytes (the request's unit); at most RANGES of them, empty ones left out."""
    ranges: list[tuple[int, int]] = []
    left = max(0, budget)
    for group in groups:
        if not group or left < 16:
            break
        share = left // len(group)
        for t in group:
            if not t.is_contiguous():
                raise ValueError(f"l2 prefetch: a tensor of shape {tuple(t.shape)} is not contiguous")
            size = min(share, t.numel() * t.element_size()) // 16 * 16
            if size and len(ranges) < RANGES:
                ranges.append((t.data_ptr(), size))
                left -= size
    return ranges


@functools.cache
def available(device_index: int) -> tuple[bool, str]:
    """Whether the kernel builds and loads here, and why not (bulk prefetch needs sm_90)."""
    if not torch.cuda.is_available():
        return False, "no CUDA"
    if torch.cuda.get_device_capability(device_index) < (9, 0):
        return False, "needs compute capability 9.0 (cp.async.bulk.prefetch)"
    try:
        _function(device_index)
    except (OSError, RuntimeError, AttributeError) as e:  # no NVRTC, a failed build, an old driver
        return False, f"NVRTC: {e}"
    return True, "on"


def budget(device_index: int) -> int:
    """BUDGET_BYTES, at most the device's L2."""
    return min(BUDGET_BYTES, torch.cuda.get_device_properties(device_index).L2_cache_size)


def launch(ranges: list[tuple[int, int]], device_index: int, stream: torch.cuda.Stream) -> None:
    """One launch on `stream` asking for `ranges` (plan's)."""
    padded = list(ranges) + [(0, 0)] * (RANGES - len(ranges))
    args = [v for address, size in padded for v in (ctypes.c_void_p(address), ctypes.c_uint64(size))]
    nvrtc.launch(_function(device_index), (BLOCKS, 1, 1), (32, 1, 1), 0, args, stream)


@functools.cache
def _function(device_index: int) -> ctypes.c_void_p:
    major, minor = torch.cuda.get_device_capability(device_index)
    cubin = nvrtc.compile_source(SOURCE.read_text(), SOURCE.name, f"sm_{major}{minor}", ())
    return nvrtc.load_function(device_index, cubin, "l2_prefetch")
