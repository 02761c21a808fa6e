"""LLM's constructor arguments -> an EngineConfig, every value checked where it enters.

Names follow vLLM where they overlap (`max_model_len`, `max_num_seqs`, `gpu_memory_utilization`,
`enforce_eager`, `tensor_parallel_size`, `seed`, `tokenizer`, `dtype`); fastpath's own spellings
(`max_seq_len`, `max_batch_size`, `tp`) are aliases of the same settings. An unknown keyword is a
TypeError with a suggestion.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..model.config import ModelConfig
from ..runner.config import EngineConfig, resolve_device, resolve_dtype, resolve_graph_sizes
from .sampling_params import MAX_INT64

# alias -> the setting it names
ALIASES = {"max_model_len": "max_seq_len", "max_num_seqs": "max_batch_size", "tp": "tensor_parallel_size"}


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """Every keyword LLM takes besides `model`, with its default."""

    tokenizer: str | Path | None = None
    dtype: str | None = None  # None: bfloat16 on CUDA, float32 on the CPU
    device: str = "auto"
    seed: int = 0
    max_batch_size: int = 16
    max_seq_len: int | None = None  # None: min(4096, the model's max_position_embeddings)
    max_num_batched_tokens: int | None = None
    kv_cache_blocks: int | None = None
    gpu_memory_utilization: float = 0.85
    cuda_graphs: bool | None = None
    enforce_eager: bool = False
    graph_batch_sizes: tuple[int, ...] | None = None
    fused_kernels: bool | None = None
    fmha_enabled: tuple[str, ...] | None = None
    fmha_prepend: tuple[str, ...] = ()
    dispatch_mode: str | None = None  # None: the extension's fixed mode, else auto
    on_unsupported: str | None = None
    guided_backend: str = "auto"
    tensor_parallel_size: int = 1
    tp_timeout_s: float = 300.0  # bounds a rank's start-up and each device collective
    hooks: Any = None
    executor_cls: Any = None


NAMES = tuple(f.name for f in fields(EngineOptions))


def parse_options(kwargs: dict[str, Any]) -> EngineOptions:
    """Resolve aliases and refuse unknown keywords."""
    given: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in kwargs.items():
        name = ALIASES.get(key, key)
        if name not in NAMES:
            close = difflib.get_close_matches(key, [*NAMES, *ALIASES], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"LLM() got an unexpected keyword argument {key!r}{hint}")
        if name in given and given[name] != value:
            raise ValueError(
                f"{spelled[name]}={given[name]!r} and {key}={value!r} disagree (both set {name})"
            )
        given[name], spelled[name] = value, key
    return EngineOptions(**given)


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    ok = (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= low
        and (high is None or value <= high)
    )
    if not ok:
        upper = f", at most {high}" if high is not None else ""
        raise ValueError(f"{name} must be an int >= {low}{upper}, got {value!r}")
    return value


def engine_config(cfg: ModelConfig, checkpoint: Path | None, o: EngineOptions) -> EngineConfig:
    dev = resolve_device(o.device)
    max_batch = _int("max_batch_size", o.max_batch_size, 1, 4096)
    max_seq = _int("max_seq_len", o.max_seq_len or min(4096, cfg.max_position_embeddings), 2)
    tp = _int("tensor_parallel_size", o.tensor_parallel_size, 1, 64)
    seed = _int("seed", o.seed, 0, MAX_INT64)
    if not (isinstance(o.gpu_memory_utilization, (int, float)) and 0 < o.gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {o.gpu_memory_utilization!r}")
    graphs = False if o.enforce_eager else o.cuda_graphs
    return EngineConfig(
        model=cfg,
        checkpoint=checkpoint,
        tokenizer=Path(o.tokenizer) if o.tokenizer is not None else None,
        device=dev,
        dtype=resolve_dtype(o.dtype or ("bfloat16" if dev.type == "cuda" else "float32")),
        max_batch_size=max_batch,
        max_seq_len=max_seq,
        max_num_batched_tokens=_int(
            "max_num_batched_tokens", o.max_num_batched_tokens or max(2048, max_seq), 1
        ),
        kv_cache_blocks=None if o.kv_cache_blocks is None else _int("kv_cache_blocks", o.kv_cache_blocks, 2),
        memory_fraction=float(o.gpu_memory_utilization),
        cuda_graphs=graphs is not False and dev.type == "cuda",
        graph_batch_sizes=resolve_graph_sizes(graphs, o.graph_batch_sizes, dev, max_batch),
        fused_kernels=o.fused_kernels,
        fmha_enabled=tuple(o.fmha_enabled) if o.fmha_enabled is not None else None,
        fmha_prepend=tuple(o.fmha_prepend),
        dispatch_mode=o.dispatch_mode,
        on_unsupported=o.on_unsupported,
        guided_backend=o.guided_backend,
        seed=seed,
        tensor_parallel_size=tp,
    )
