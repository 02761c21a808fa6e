"""FlashInfer, when it is installed: its single-sequence prefill and decode kernels over gathered pages."""

from __future__ import annotations

import importlib.util

import torch

from .library import FmhaLibrary
from .metadata import AttentionConfig, AttentionShapes, gather_kv


class FlashInferAttention(FmhaLibrary):
    name = "flashinfer"

    def is_available(self, cfg: AttentionConfig) -> list[str]:
        if importlib.util.find_spec("flashinfer") is None:
            return ["the flashinfer package is not installed"]
        if cfg.device_type != "cuda":
            return [f"flashinfer runs on CUDA only (device is {cfg.device_type})"]
        if cfg.dtype not in (torch.float16, torch.bfloat16):
            return [f"flashinfer needs float16 or bfloat16, got {cfg.dtype}"]
        return []

    def supports(self, shapes: AttentionShapes) -> list[str]:
        reasons = []
        if shapes.phase == "decode" and shapes.needs_mask:
            reasons.append(
                "fastpath's flashinfer adapter decodes one exact-length sequence per call (no padding mask)"
            )
        if shapes.phase == "prefill" and shapes.needs_mask:
            reasons.append("fastpath's flashinfer adapter has no sliding window")
        return reasons

    def forward(self, q, k_cache, v_cache, meta, scale):
        import flashinfer

        outs, start = [], 0
        lens = meta.query_lens if meta.phase == "prefill" else [1] * meta.num_seqs
        for i, (qlen, ctx) in enumerate(zip(lens, meta.context_lens_host, strict=True)):
            k = gather_kv(k_cache, meta.block_tables[i : i + 1], ctx)[0].transpose(0, 1).contiguous()
            v = gather_kv(v_cache, meta.block_tables[i : i + 1], ctx)[0].transpose(0, 1).contiguous()
            qi = q[start : start + qlen]
            if meta.phase == "decode":
                out = flashinfer.single_decode_with_kv_cache(qi[0], k, v, kv_layout="NHD", sm_scale=scale)[
                    None
                ]
            else:
                out = flashinfer.single_prefill_with_kv_cache(
                    qi, k, v, causal=True, kv_layout="NHD", sm_scale=scale
                )
            outs.append(out)
            start += qlen
        return torch.cat(outs, dim=0)
