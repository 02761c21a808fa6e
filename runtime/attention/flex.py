"""FlexAttention: masks as functions. Compiled on CUDA (its fused kernel), eager elsewhere."""

from __future__ import annotations

import warnings

import torch

from .library import DenseFmhaLibrary
from .metadata import AttentionConfig, AttentionShapes


class FlexAttention(DenseFmhaLibrary):
    name = "flex_attention"

    def __init__(self) -> None:
        self._fn = None

    def is_available(self, cfg: AttentionConfig) -> list[str]:
        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError as exc:
            return [f"torch {torch.__version__} has no flex_attention: {exc}"]
        if cfg.head_dim < 16 or cfg.head_dim & (cfg.head_dim - 1):
            return [f"flex_attention needs a power-of-two head_dim >= 16, got {cfg.head_dim}"]
        # The unfused eager path is for correctness on CPU; CUDA gets the compiled kernel.
        self._fn = (
            torch.compile(flex_attention, dynamic=True) if cfg.device_type == "cuda" else flex_attention
        )
        return []

    def supports(self, shapes: AttentionShapes) -> list[str]:
        if shapes.capturing:
            return [
                "flex_attention builds its block mask on the host per call, which CUDA-graph capture cannot hold"
            ]
        return []

    def dense(self, q, k, v, mask, causal, scale):
        from torch.nn.attention.flex_attention import create_block_mask

        lq, lk = q.shape[2], k.shape[2]
        block_mask = None
        if mask is not None:
            dense_mask = mask.expand(q.shape[0], 1, lq, lk)

            def mask_mod(b, h, qi, ki):
                return dense_mask[b, 0, qi, ki]

            block_mask = create_block_mask(mask_mod, q.shape[0], 1, lq, lk, device=q.device)
        elif causal:
            offset = lk - lq

            def mask_mod(b, h, qi, ki):
                return ki <= qi + offset

            block_mask = create_block_mask(mask_mod, 1, 1, lq, lk, device=q.device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager flex warns that it is unfused; on CPU that is the point
            return self._fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
