"""LLM's constructor arguments -> an EngineConfig, every value checked where it enters.

Names follow vLLM where they overlap (`max_model_len`, `max_num_seqs`, `gpu_memory_utilization`,
`enforce_eager`, `tensor_parallel_size`, `seed`, `tokenizer`, `dtype`); fastpath's own spellings
(`max_seq_len`, `max_batch_size`, `tp`) are aliases of the same settings. vLLM's keywords that
fastpath has no setting for are accepted at values that ask for what it does (`trust_remote_code`,
`kv_cache_dtype="auto"`, ...; vllm_keywords.py). An unknown keyword is a TypeError with a
suggestion.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from fastpath.vocab import ALLOW_LONG_ENV, LLM_INT_BOUNDS, TP_ALLREDUCE

from ..model.config import ModelConfig
from ..runner.config import EngineConfig, resolve_device, resolve_dtype, resolve_graph_sizes
from . import vllm_keywords
from .sampling_params import doc

# alias -> the setting it names
ALIASES = {"max_model_len": "max_seq_len", "max_num_seqs": "max_batch_size", "tp": "tensor_parallel_size"}


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """Every keyword LLM takes besides `model`, with its default."""

    tokenizer: str | Path | None = field(
        default=None, metadata=doc("A tokenizer folder; None: the checkpoint's own.")
    )
    dtype: str | None = field(
        default=None,
        metadata=doc(
            "float32, bfloat16 or float16 (vLLM's half and float too); None or auto: bfloat16 on CUDA, float32 on the CPU."
        ),
    )
    device: str = field(default="auto", metadata=doc("auto (CUDA when present), cuda, cuda:N or cpu."))
    seed: int | None = field(
        default=0,
        metadata=doc("Seeds random weights and requests that carry no seed, in [0, 2**63); None: 0."),
    )
    max_batch_size: int = field(
        default=16, metadata=doc("The most sequences decoded in one step (alias: max_num_seqs), 1 to 4096.")
    )
    max_seq_len: int | None = field(
        default=None,
        metadata=doc(
            "The longest sequence, prompt and output (alias: max_model_len); None: min(4096, the model's)."
        ),
    )
    max_num_batched_tokens: int | None = field(
        default=None, metadata=doc("Tokens one prefill step may compute; None: max(2048, max_seq_len).")
    )
    kv_cache_blocks: int | None = field(
        default=None,
        metadata=doc("KV-cache blocks of 16 tokens; None: sized from the limits and free memory."),
    )
    gpu_memory_utilization: float = field(
        default=0.85, metadata=doc("Share of free device memory the KV cache may take, in (0, 1].")
    )
    cuda_graphs: bool | None = field(
        default=None, metadata=doc("Capture decode steps as CUDA graphs; None: on CUDA.")
    )
    enforce_eager: bool = field(default=False, metadata=doc("vLLM's switch: True turns CUDA graphs off."))
    graph_batch_sizes: tuple[int, ...] | None = field(
        default=None, metadata=doc("Batch sizes to capture; None: powers of two up to max_batch_size.")
    )
    fused_kernels: bool | None = field(
        default=None, metadata=doc("Triton kernels; None: on CUDA when Triton is there.")
    )
    fmha_enabled: tuple[str, ...] | None = field(
        default=None, metadata=doc("Attention libraries in order of preference; None: the default order.")
    )
    fmha_prepend: tuple[str, ...] = field(
        default=(), metadata=doc("Attention libraries tried before the others.")
    )
    mixed_batches: bool | None = field(
        default=None,
        metadata=doc(
            "Running sequences decode in the same step as a prefill, instead of waiting for it; None: "
            "when the prefill attention takes every sequence in one launch (triton_prefill) and "
            "max_num_batched_tokens >= max_batch_size (True needs the latter)."
        ),
    )
    prefill_graphs: bool | None = field(
        default=None,
        metadata=doc(
            "Capture prefill steps as CUDA graphs at a few padded token counts; None: with cuda_graphs, "
            "on one rank, when the prefill attention takes every sequence in one launch (triton_prefill)."
        ),
    )
    dispatch_mode: str | None = field(
        default=None,
        metadata=doc("Host dispatch: blocking, spin or auto; None: the extension's fixed mode, else auto."),
    )
    on_unsupported: str | None = field(
        default=None, metadata=doc("What spin does when only blocking is left: warn_once or error.")
    )
    guided_backend: str = field(
        default="auto",
        metadata=doc("auto (xgrammar, else llguidance, when installed), xgrammar, llguidance or none."),
    )
    tensor_parallel_size: int = field(
        default=1, metadata=doc("GPUs that split each layer (alias: tp), 1 to 64.")
    )
    tp_allreduce: str = field(
        default="auto",
        metadata=doc(
            "How tensor-parallel all-reduces travel: auto (symmetric memory for small messages on "
            "CUDA, NCCL above) or nccl."
        ),
    )
    tp_timeout_s: float = field(
        default=300.0, metadata=doc("Bounds a rank's start-up and each device collective, in seconds.")
    )
    hooks: Any = field(
        default=None, metadata=doc("RuntimeHooks; None: the model's own declaration, or all off.")
    )
    executor_cls: Any = field(
        default=None, metadata=doc("The executor class; a generated package passes its own.")
    )
    generation_config: str | Path = field(
        default="auto",
        metadata=doc(
            "Sampling defaults for what a request leaves unset: auto (the model's generation_config.json, "
            "as vLLM), vllm (SamplingParams' own), or a folder holding a generation_config.json."
        ),
    )
    enable_prefix_caching: bool | None = field(
        default=False,
        metadata=doc(
            "Keep the KV of whole 16-token blocks findable by their tokens, so a prompt that starts "
            "like an earlier one (a shared system prompt, a conversation's next turn) prefills only the "
            "rest. Off by default (vLLM's is on); None is off."
        ),
    )
    enable_lora: bool = field(
        default=False,
        metadata=doc(
            "Serve LoRA adapters (PEFT folders) named per request by a LoRARequest, as vLLM; the "
            "projections then run unfused, with every adapter's delta in the same matmuls."
        ),
    )
    max_loras: int = field(
        default=1, metadata=doc("Adapters that can run in one batch (device slots), 1 to 64.")
    )
    max_lora_rank: int = field(default=16, metadata=doc("The largest adapter rank accepted, 1 to 512."))
    max_cpu_loras: int | None = field(
        default=None,
        metadata=doc(
            "Adapters whose weights stay in host memory when no request uses them, so a slot takes "
            "them again without reading their folder; at least max_loras. None: max_loras (vLLM's)."
        ),
    )
    pooler_config: Any = field(
        default=None,
        metadata=doc(
            "How embed() and encode() pool a prompt: {'pooling_type': LAST | MEAN | CLS, 'normalize': "
            "bool}; None: the checkpoint's sentence-transformers config, else the last token, normalized."
        ),
    )
    engine_process: bool = field(
        default=False,
        metadata=doc(
            "Run the scheduler and the device in a process of their own (as vLLM's V1 engine core), so "
            "the caller's Python never holds the engine's GIL; `fastpath serve` turns it on."
        ),
    )


NAMES = tuple(f.name for f in fields(EngineOptions))


def parse_options(kwargs: dict[str, Any]) -> EngineOptions:
    """Resolve aliases, accept vLLM's keywords where they ask for what fastpath does
    (vllm_keywords.py), and refuse unknown keywords."""
    given: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in kwargs.items():
        name = ALIASES.get(key, key)
        if name not in NAMES and key in vllm_keywords.NEUTRAL:
            vllm_keywords.check(key, value)
            continue
        if name not in NAMES:
            close = difflib.get_close_matches(key, [*NAMES, *ALIASES, *vllm_keywords.NEUTRAL], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"LLM() got an unexpected keyword argument {key!r}{hint}")
        if name in given and given[name] != value:
            raise ValueError(
                f"{spelled[name]}={given[name]!r} and {key}={value!r} disagree (both set {name})"
            )
        given[name], spelled[name] = value, key
    if "seed" in given and given["seed"] is None:
        given["seed"] = 0  # vLLM's callers pass seed=None for "the default"
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


# vLLM's dtype names; "auto" is what None means here.
DTYPE_ALIASES = {"auto": None, "half": "float16", "float": "float32"}


def model_dtype(o: EngineOptions) -> torch.dtype:
    """The weights' dtype: as asked, else bfloat16 on CUDA and float32 on the CPU."""
    dtype = DTYPE_ALIASES.get(o.dtype, o.dtype) if isinstance(o.dtype, str) else o.dtype
    return resolve_dtype(dtype or ("bfloat16" if resolve_device(o.device).type == "cuda" else "float32"))


def _check_switches(o: EngineOptions) -> None:
    """A switch is True or False (None where it means "decide for me"): "no" is not False."""
    for name, optional in (("cuda_graphs", True), ("enforce_eager", False), ("fused_kernels", True),
                           ("engine_process", False), ("mixed_batches", True), ("prefill_graphs", True),
                           ("enable_prefix_caching", True), ("enable_lora", False)):  # fmt: skip
        value = getattr(o, name)
        if not isinstance(value, bool) and not (optional and value is None):
            allowed = "True, False or None" if optional else "True or False"
            raise ValueError(f"{name} must be {allowed}, got {value!r}")


def engine_config(cfg: ModelConfig, checkpoint: Path | None, o: EngineOptions) -> EngineConfig:
    _check_switches(o)
    dev = resolve_device(o.device)
    max_batch = _int("max_batch_size", o.max_batch_size, *LLM_INT_BOUNDS["max_batch_size"])
    max_seq = _int(
        "max_seq_len", o.max_seq_len or min(4096, cfg.max_position_embeddings), *LLM_INT_BOUNDS["max_seq_len"]
    )
    if max_seq > cfg.max_position_embeddings and os.environ.get(ALLOW_LONG_ENV) != "1":
        # Positions past what the model was trained on give silently worse text (vLLM refuses too).
        raise ValueError(
            f"max_seq_len (max_model_len) {max_seq} is longer than the model's max_position_embeddings "
            f"{cfg.max_position_embeddings}; set {ALLOW_LONG_ENV}=1 to allow it anyway"
        )
    tp = _int("tensor_parallel_size", o.tensor_parallel_size, *LLM_INT_BOUNDS["tensor_parallel_size"])
    seed = _int("seed", o.seed, *LLM_INT_BOUNDS["seed"])
    if o.fmha_enabled is not None and not tuple(o.fmha_enabled):
        raise ValueError("fmha_enabled must name at least one attention library (None: the default order)")
    if not (isinstance(o.gpu_memory_utilization, (int, float)) and 0 < o.gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {o.gpu_memory_utilization!r}")
    graphs = False if o.enforce_eager else o.cuda_graphs
    budget = _int("max_num_batched_tokens", o.max_num_batched_tokens or max(2048, max_seq), 1)
    if o.mixed_batches and budget < max_batch:
        # Every decoding sequence rides along first: with fewer tokens than sequences, none is admitted.
        raise ValueError(
            f"mixed_batches needs max_num_batched_tokens ({budget}) >= max_batch_size ({max_batch}), "
            "so a prefill step has room beside every decoding sequence"
        )
    if o.prefill_graphs:
        blocked = {
            "CUDA graphs are off": graphs is False,
            "the device is not CUDA": dev.type != "cuda",
            f"tensor_parallel_size is {tp} (prefill graphs run on one rank)": tp > 1,
        }
        why = next((reason for reason, hit in blocked.items() if hit), None)
        if why is not None:
            raise ValueError(f"prefill_graphs=True cannot be honoured: {why}")
    max_loras = _int("max_loras", o.max_loras, 1, 64)
    max_lora_rank = _int("max_lora_rank", o.max_lora_rank, 1, 512)
    max_cpu_loras = max_loras if o.max_cpu_loras is None else _int("max_cpu_loras", o.max_cpu_loras, 1)
    if max_cpu_loras < max_loras:
        raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be at least max_loras ({max_loras})")
    if o.enable_lora and o.prefill_graphs:
        raise ValueError("prefill_graphs=True cannot be honoured: LoRA adapters are on (enable_lora)")
    if o.tp_allreduce not in TP_ALLREDUCE:
        raise ValueError(f"tp_allreduce must be one of {', '.join(TP_ALLREDUCE)}, got {o.tp_allreduce!r}")
    return EngineConfig(
        model=cfg,
        checkpoint=checkpoint,
        tokenizer=Path(o.tokenizer) if o.tokenizer is not None else None,
        device=dev,
        dtype=model_dtype(o),
        max_batch_size=max_batch,
        max_seq_len=max_seq,
        max_num_batched_tokens=budget,
        kv_cache_blocks=None if o.kv_cache_blocks is None else _int("kv_cache_blocks", o.kv_cache_blocks, 2),
        memory_fraction=float(o.gpu_memory_utilization),
        cuda_graphs=graphs is not False and dev.type == "cuda",
        graph_batch_sizes=resolve_graph_sizes(graphs, o.graph_batch_sizes, dev, max_batch),
        fused_kernels=o.fused_kernels,
        fmha_enabled=tuple(o.fmha_enabled) if o.fmha_enabled is not None else None,
        fmha_prepend=tuple(o.fmha_prepend),
        mixed_batches=o.mixed_batches,
        prefill_graphs=o.prefill_graphs,
        dispatch_mode=o.dispatch_mode,
        on_unsupported=o.on_unsupported,
        guided_backend=o.guided_backend,
        seed=seed,
        tensor_parallel_size=tp,
        tp_allreduce=o.tp_allreduce,
        enable_prefix_caching=bool(o.enable_prefix_caching),
        max_loras=max_loras if o.enable_lora else 0,
        max_lora_rank=max_lora_rank,
        max_cpu_loras=max_cpu_loras,
    )
