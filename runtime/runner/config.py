"""Everything an executor is built from, resolved: no 'auto' is left in it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fastpath.vocab import default_graph_batch_sizes

from ..model.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig
    checkpoint: Path | None  # None: seeded random weights
    device: torch.device
    dtype: torch.dtype
    max_batch_size: int = 16
    max_seq_len: int = 4096
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_blocks: int | None = None  # None: sized from the batch and sequence limits (and free memory)
    memory_fraction: float = 0.85  # of free device memory the cache may take (vLLM's gpu_memory_utilization)
    cuda_graphs: bool = False
    fused_kernels: bool | None = None  # None: Triton kernels on CUDA, torch ops elsewhere
    graph_batch_sizes: tuple[int, ...] = ()
    fmha_enabled: tuple[str, ...] | None = None
    fmha_prepend: tuple[str, ...] = ()
    mixed_batches: bool | None = None  # None: when the prefill attention is one launch for every sequence
    prefill_graphs: bool | None = None  # None: with cuda_graphs, when the prefill attention can be captured
    dispatch_mode: str | None = None  # None: the extension's fixed mode, else auto
    on_unsupported: str | None = None  # None: the extension's fixed policy, else warn_once
    guided_backend: str = "none"
    seed: int = 0
    tensor_parallel_size: int = 1
    tp_allreduce: str = "auto"  # vocab.TP_ALLREDUCE
    tokenizer: Path | None = None  # None: the checkpoint's own, if it has one
    enable_prefix_caching: bool = False  # KV blocks found again by their tokens (prefix_cache.py)
    max_loras: int = 0  # LoRA adapter slots on the device (model/lora_table.py); 0: LoRA is off
    max_lora_rank: int = 16
    max_cpu_loras: int = 1  # adapters whose weights stay on the host when no request uses them


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was requested but no CUDA device is visible")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"device: {device} is not supported (cuda, cpu or auto)")
    return device


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype: {dtype} is not supported; use one of {', '.join(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_graph_sizes(
    enabled: bool | None, sizes, device: torch.device, max_batch_size: int
) -> tuple[int, ...]:
    """Graph buckets: the requested ones, else powers of two up to max_batch_size (which is always covered)."""
    if enabled is False or device.type != "cuda":
        if enabled and device.type != "cuda":
            raise ValueError("cuda_graphs: CUDA graphs were requested on a CPU device")
        return ()
    chosen = sorted(
        {int(b) for b in (sizes or default_graph_batch_sizes(max_batch_size)) if int(b) <= max_batch_size}
    )
    if not chosen or chosen[-1] < max_batch_size:
        chosen.append(max_batch_size)
    return tuple(chosen)
