"""What one step tells attention: where tokens go in the paged cache and what each query may see."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

Phase = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    """The model- and device-level facts a library's availability depends on."""

    device_type: str  # "cpu" | "cuda"
    dtype: torch.dtype
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None


@dataclass(frozen=True, slots=True)
class AttentionShapes:
    """The per-call facts a library's support depends on; small and hashable, so selection is cached."""

    phase: Phase
    needs_mask: bool  # ragged lengths or a sliding window: a dense mask is required
    chunked: bool  # prefill with cached prefix: causal aligned to the bottom-right
    capturing: bool  # inside CUDA-graph capture: shapes fixed, no host syncs


@dataclass(slots=True)
class AttentionMetadata:
    phase: Phase
    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    block_tables: torch.Tensor  # [S, W] block ids per sequence
    context_lens: torch.Tensor  # [S] tokens in cache after this step
    # Host copies, known without a device sync (prefill only needs these).
    query_lens: list[int] = field(default_factory=list)
    context_lens_host: list[int] = field(default_factory=list)
    block_size: int = 16
    sliding_window: int | None = None
    capturing: bool = False
    _decode_mask: torch.Tensor | None = None
    _tables: dict = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return self.block_tables.shape[0]

    def kv_len(self) -> int:
        """Keys gathered per decode sequence: the table width, so graph replays see fixed shapes."""
        return self.block_tables.shape[1] * self.block_size

    def decode_shapes(self) -> AttentionShapes:
        ragged = (
            self.capturing
            or len(set(self.context_lens_host)) > 1
            or self.kv_len() != max(self.context_lens_host)
        )
        return AttentionShapes("decode", ragged or self.sliding_window is not None, False, self.capturing)

    def prefill_shapes(self) -> AttentionShapes:
        # A captured step's lengths are unknown at capture: it takes the general, chunked case.
        chunked = self.capturing or any(
            c != q for c, q in zip(self.context_lens_host, self.query_lens, strict=True)
        )
        return AttentionShapes("prefill", self.sliding_window is not None, chunked, self.capturing)

    def host_table(self, name: str, variant: int, build: Callable[[], list[int]]) -> torch.Tensor:
        """An int32 table a kernel reads, built on the host once per step and shared by every layer."""
        key = (name, variant)
        table = self._tables.get(key)
        if table is None:
            table = torch.tensor(build(), dtype=torch.int32)
            device = self.block_tables.device
            if device.type == "cuda":  # pinned, so the copy does not hold up the host
                table = table.pin_memory()
            table = table.to(device, non_blocking=True)
            self._tables[key] = table
        return table

    def decode_mask(self) -> torch.Tensor:
        """[S, 1, 1, L] True where a key is visible; built once per step, shared by every layer."""
        if self._decode_mask is None:
            keys = torch.arange(self.kv_len(), device=self.context_lens.device)
            lens = self.context_lens[:, None]
            mask = keys[None, :] < lens
            if self.sliding_window is not None:
                mask &= keys[None, :] >= lens - self.sliding_window
            self._decode_mask = mask[:, None, None, :]
        return self._decode_mask


def prefill_mask(query_len: int, context_len: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[1, 1, Lq, Lk] causal mask aligned to the last query, with an optional sliding window."""
    pos = torch.arange(context_len - query_len, context_len, device=device)[:, None]
    keys = torch.arange(context_len, device=device)[None, :]
    mask = keys <= pos
    if window is not None:
        mask &= keys > pos - window
    return mask[None, None]


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """Paged cache [N, B, H, D] + block table [S, W] -> dense [S, H, length, D]."""
    nblocks = -(-length // cache.shape[1])
    blocks = cache[block_table[:, :nblocks]]  # [S, nb, B, H, D]
    return blocks.flatten(1, 2)[:, :length].transpose(1, 2)
