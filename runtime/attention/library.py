"""The FMHA library contract, and the dense path most libraries share."""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod

import torch

from .metadata import AttentionConfig, AttentionMetadata, AttentionShapes, gather_kv, prefill_mask


class KernelRefused(RuntimeError):
    """A library's kernel declined this exact call (a shape limit no probe can foresee); the next library runs."""


class FmhaLibrary(ABC):
    """An attention implementation. `is_available` and `supports` return reasons; an empty list means yes."""

    name: str = ""
    # One launch takes every sequence of a prefill step (a dense library runs them one by one).
    batched_prefill: bool = False

    def is_available(self, cfg: AttentionConfig) -> list[str]:
        return []

    def supports(self, shapes: AttentionShapes) -> list[str]:
        return []

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """q [T, H, D] and this layer's paged cache -> attention output [T, H, D]."""


class TritonFmhaLibrary(FmhaLibrary):
    """fastpath's own paged Triton kernels: CUDA, fp16/bf16 (tensor cores), a power-of-two head_dim,
    and one phase each."""

    phase: str = ""

    def is_available(self, cfg: AttentionConfig) -> list[str]:
        reasons = []
        if cfg.device_type != "cuda":
            reasons.append(f"{self.name} runs on CUDA only (device is {cfg.device_type})")
        if importlib.util.find_spec("triton") is None:
            reasons.append("the triton package is not installed")
        if cfg.dtype not in (torch.float16, torch.bfloat16):
            reasons.append(f"{self.name} uses tensor cores, which would round {cfg.dtype} to tf32")
        if cfg.head_dim < 16 or cfg.head_dim & (cfg.head_dim - 1):
            reasons.append(f"{self.name} needs a power-of-two head_dim >= 16, got {cfg.head_dim}")
        return reasons

    def supports(self, shapes: AttentionShapes) -> list[str]:
        return [] if shapes.phase == self.phase else [f"{self.name} implements the {self.phase} phase only"]


class DenseFmhaLibrary(FmhaLibrary):
    """Gathers each sequence's keys and values out of the paged cache, then runs one dense kernel.

    Subclasses implement `dense(q, k, v, mask, causal_lower_right, scale)` on [S, H, L, D] tensors.
    """

    @abstractmethod
    def dense(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        scale: float,
    ) -> torch.Tensor:
        """[S, H, Lq, D] queries over [S, Hkv, Lk, D] keys and values, masked or bottom-right causal."""

    def forward(self, q, k_cache, v_cache, meta, scale):
        if meta.phase == "decode":
            return self._decode(q, k_cache, v_cache, meta, scale)
        return self._prefill(q, k_cache, v_cache, meta, scale)

    def _decode(self, q, k_cache, v_cache, meta, scale):
        length = meta.kv_len()
        k = gather_kv(k_cache, meta.block_tables, length)
        v = gather_kv(v_cache, meta.block_tables, length)
        mask = meta.decode_mask() if meta.decode_shapes().needs_mask else None
        out = self.dense(q[:, :, None, :], k, v, mask, False, scale)  # [S, H, 1, D]
        return out[:, :, 0, :]

    def _prefill(self, q, k_cache, v_cache, meta, scale):
        outs = []
        start = 0
        window = meta.sliding_window
        for i, (qlen, ctx) in enumerate(zip(meta.query_lens, meta.context_lens_host, strict=True)):
            qi = q[start : start + qlen].transpose(0, 1)[None]  # [1, H, Lq, D]
            k = gather_kv(k_cache, meta.block_tables[i : i + 1], ctx)
            v = gather_kv(v_cache, meta.block_tables[i : i + 1], ctx)
            mask = prefill_mask(qlen, ctx, window, q.device) if window is not None else None
            out = self.dense(qi, k, v, mask, mask is None, scale)
            outs.append(out[0].transpose(0, 1))
            start += qlen
        return torch.cat(outs, dim=0)
