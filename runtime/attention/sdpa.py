"""torch SDPA, one named library per backend, so precedence can name exactly which kernel runs."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from .library import DenseFmhaLibrary, KernelRefused
from .metadata import AttentionConfig, AttentionShapes

_BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_math": SDPBackend.MATH,
}

# What a backend can be asked to do; each is probed once on the real device and dtype.
_FEATURES = ("plain", "mask", "causal_lower_right", "gqa")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


class SdpaAttention(DenseFmhaLibrary):
    def __init__(self, name: str) -> None:
        self.name = name
        self.backend = _BACKENDS[name]
        self._feature_errors: dict[str, str] = {}

    def _probe(self, cfg: AttentionConfig, feature: str) -> str | None:
        device = torch.device(cfg.device_type)
        heads, kv_heads = (cfg.num_heads, cfg.num_kv_heads) if feature == "gqa" else (cfg.num_kv_heads,) * 2
        q = torch.randn(1, heads, 3, cfg.head_dim, device=device, dtype=cfg.dtype)
        k = torch.randn(1, kv_heads, 5, cfg.head_dim, device=device, dtype=cfg.dtype)
        kwargs: dict = {}
        if feature == "mask":
            kwargs["attn_mask"] = torch.ones(1, 1, 3, 5, dtype=torch.bool, device=device)
        elif feature == "causal_lower_right":
            kwargs["attn_mask"] = causal_lower_right(3, 5)
        elif feature == "gqa" and heads != kv_heads:
            kwargs["enable_gqa"] = True
        try:
            with warnings.catch_warnings(), sdpa_kernel(self.backend):
                warnings.simplefilter("ignore")  # torch explains each refusal; the reason is recorded instead
                F.scaled_dot_product_attention(q, k, k, **kwargs)
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            return _first_line(exc)
        return None

    def is_available(self, cfg: AttentionConfig) -> list[str]:
        if cfg.device_type != "cuda" and self.backend in (
            SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.CUDNN_ATTENTION,
        ):
            return [f"{self.name} runs on CUDA only (device is {cfg.device_type})"]
        self._feature_errors = {f: err for f in _FEATURES if (err := self._probe(cfg, f)) is not None}
        if "plain" in self._feature_errors:
            return [
                f"{self.name} rejects {cfg.dtype} head_dim={cfg.head_dim}: {self._feature_errors['plain']}"
            ]
        return []

    def supports(self, shapes: AttentionShapes) -> list[str]:
        reasons = []
        if shapes.needs_mask and "mask" in self._feature_errors:
            reasons.append(f"needs a dense mask, which {self.name} rejects: {self._feature_errors['mask']}")
        if shapes.chunked and not shapes.needs_mask and "causal_lower_right" in self._feature_errors:
            reasons.append(
                f"chunked prefill needs lower-right causal: {self._feature_errors['causal_lower_right']}"
            )
        return reasons

    def dense(self, q, k, v, mask, causal, scale):
        kwargs: dict = {"scale": scale}
        if q.shape[1] != k.shape[1]:
            if "gqa" in self._feature_errors:
                groups = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            else:
                kwargs["enable_gqa"] = True
        if mask is not None:
            kwargs["attn_mask"] = mask
        elif causal:
            lq, lk = q.shape[2], k.shape[2]
            if lq == lk:
                kwargs["is_causal"] = True
            else:
                kwargs["attn_mask"] = causal_lower_right(lq, lk)
        try:
            with sdpa_kernel(self.backend):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        except RuntimeError as exc:
            if "No available kernel" not in str(exc):
                raise
            raise KernelRefused(f"{self.name} has no kernel for q{tuple(q.shape)} k{tuple(k.shape)}") from exc
