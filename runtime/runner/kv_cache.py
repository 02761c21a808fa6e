"""The paged KV cache: one pool of fixed-size blocks per layer, shared by every attention library."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import torch

from ..model.config import ModelConfig

log = logging.getLogger("fastpath.kv_cache")

NULL_BLOCK = 0  # never handed out: padded graph rows write here, so they cannot touch live pages


class CacheFullError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class CacheSizing:
    block_size: int
    num_blocks: int
    reason: str


def size_cache(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_batch_size: int,
    max_seq_len: int,
    block_size: int = 16,
    memory_fraction: float = 0.85,
    num_blocks: int | None = None,
) -> CacheSizing:
    blocks_per_seq = -(-max_seq_len // block_size)
    if num_blocks is not None:
        if num_blocks < blocks_per_seq + 1:
            raise CacheFullError(
                f"kv_cache_blocks={num_blocks} cannot hold one {max_seq_len}-token sequence "
                f"({blocks_per_seq} blocks plus the null block)"
            )
        return CacheSizing(block_size, num_blocks, "set explicitly")
    wanted = max_batch_size * blocks_per_seq + 1
    if device.type != "cuda":
        return CacheSizing(block_size, wanted, f"{max_batch_size} x {max_seq_len} tokens")
    bytes_per_block = 2 * cfg.num_layers * block_size * cfg.kv_size * dtype.itemsize
    free, total = torch.cuda.mem_get_info(device)
    # Leave room for activations and graphs: a fraction of what is free after the weights.
    budget = int(free * memory_fraction) - int(0.05 * total)
    fits = max(0, budget // bytes_per_block)
    if fits >= wanted:
        return CacheSizing(
            block_size, wanted, f"{max_batch_size} x {max_seq_len} tokens (fits in free memory)"
        )
    if fits < blocks_per_seq + 1:
        raise CacheFullError(
            f"KV cache: one {max_seq_len}-token sequence needs {blocks_per_seq + 1} blocks of "
            f"{bytes_per_block / 2**20:.1f} MiB, but only {fits} fit in free device memory"
        )
    return CacheSizing(block_size, fits, f"limited by free device memory ({fits} of {wanted} blocks)")


class KVCache:
    """k and v: [layers, blocks, block_size, kv_heads, head_dim]. Zeroed, so masked reads are finite."""

    def __init__(
        self, cfg: ModelConfig, sizing: CacheSizing, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (cfg.num_layers, sizing.num_blocks, sizing.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = sizing.block_size
        self.num_blocks = sizing.num_blocks
        log.info(  # block 0 is padding's scratch block, never handed out: the metrics count the rest
            "KV cache: %d blocks of %d tokens for sequences, one more for padding (%s)",
            sizing.num_blocks - 1,
            sizing.block_size,
            sizing.reason,
        )


class BlockAllocator:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise CacheFullError(f"need {n} KV blocks, {len(self._free)} free")
        return [self._free.popleft() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(blocks)
