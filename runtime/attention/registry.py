"""Every FMHA library fastpath knows, by the name a manifest uses."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fastpath.vocab import DEFAULT_FMHA_ORDER

from .flashinfer_lib import FlashInferAttention
from .flex import FlexAttention
from .library import FmhaLibrary
from .metadata import AttentionConfig
from .reference import ReferenceAttention
from .sdpa import SdpaAttention
from .triton_decode import TritonDecodeAttention
from .triton_prefill import TritonPrefillAttention

LIBRARIES: dict[str, Callable[[], FmhaLibrary]] = {
    "triton_decode": TritonDecodeAttention,
    "triton_prefill": TritonPrefillAttention,
    "flashinfer": FlashInferAttention,
    "sdpa_flash": lambda: SdpaAttention("sdpa_flash"),
    "sdpa_cudnn": lambda: SdpaAttention("sdpa_cudnn"),
    "sdpa_efficient": lambda: SdpaAttention("sdpa_efficient"),
    "sdpa_math": lambda: SdpaAttention("sdpa_math"),
    "flex_attention": FlexAttention,
    "reference": ReferenceAttention,
}

DEFAULT_ORDER: tuple[str, ...] = DEFAULT_FMHA_ORDER


def create(name: str) -> FmhaLibrary:
    if name not in LIBRARIES:
        raise ValueError(f"unknown FMHA library {name!r}; known: {', '.join(LIBRARIES)}")
    return LIBRARIES[name]()


def availability_report(
    names: Sequence[str],
    *,
    device_type: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 64,
    sliding_window: int | None = None,
) -> dict[str, list[str]]:
    """name -> reasons it is unavailable on this machine (empty: available)."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cpu" and dtype != torch.float32:
        dtype = torch.float32  # what a CPU run of the manifest uses for the probe
    cfg = AttentionConfig(device_type, dtype, num_heads, num_kv_heads, head_dim, sliding_window)
    return {name: create(name).is_available(cfg) for name in names}
