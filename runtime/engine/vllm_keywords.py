"""vLLM's `LLM()` keywords that fastpath has no setting for, accepted where their value asks for what
fastpath does anyway, so code written for vLLM runs unchanged; any other value is a ValueError that
says what fastpath does instead. A keyword in neither this table nor EngineOptions stays a TypeError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Neutral:
    accepts: Callable[[Any], bool]
    does: str  # what fastpath does, whatever vLLM would have done with another value


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda v: any(v is x or (type(v) is type(x) and v == x) for x in values)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v >= 0


_ANY_RUNNER = (
    "one engine runs generate() and the pooling API (embed(), encode(), score()) alike; classify and "
    "reward need heads fastpath does not have"
)
_LOCAL = "checkpoints are local folders, catalog names or random: presets; nothing is downloaded"

NEUTRAL: dict[str, Neutral] = {
    "trust_remote_code": Neutral(
        _bool, "fastpath runs its own code for the architectures it supports; none from the checkpoint"
    ),
    "revision": Neutral(_one_of(None, "main"), _LOCAL),
    "code_revision": Neutral(_one_of(None), _LOCAL),
    "tokenizer_revision": Neutral(_one_of(None, "main"), _LOCAL),
    "download_dir": Neutral(_one_of(None), _LOCAL),
    "tokenizer_mode": Neutral(_one_of("auto", "hf"), "the checkpoint's Hugging Face tokenizer"),
    "skip_tokenizer_init": Neutral(_one_of(False), "the tokenizer is always loaded"),
    "quantization": Neutral(_one_of(None), "weights run unquantized, in `dtype`"),
    "kv_cache_dtype": Neutral(_one_of("auto"), "the KV cache holds the model's dtype"),
    "enable_chunked_prefill": Neutral(
        _one_of(None, True, False), "long prompts are prefilled in steps of max_num_batched_tokens"
    ),
    "pipeline_parallel_size": Neutral(_one_of(1), "tensor parallelism only (tensor_parallel_size)"),
    "distributed_executor_backend": Neutral(
        _one_of(None, "mp"), "tensor-parallel ranks run as worker processes"
    ),
    "disable_custom_all_reduce": Neutral(_bool, "the all-reduce is chosen by message size"),
    "disable_log_stats": Neutral(_bool, "statistics are kept in llm.stats (and /metrics), not logged"),
    "block_size": Neutral(_one_of(None, 16), "the KV cache's blocks hold 16 tokens"),
    "swap_space": Neutral(_number, "no CPU swap: a preempted request is prefilled again"),
    "cpu_offload_gb": Neutral(_one_of(0, 0.0), "all weights stay on the device"),
    "max_seq_len_to_capture": Neutral(
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
        "CUDA graphs cover decode steps at graph_batch_sizes, whatever the length",
    ),
    "max_logprobs": Neutral(
        lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 20,
        "a request may ask for at most 20 logprobs",
    ),
    "task": Neutral(_one_of("auto", "generate", "embed"), _ANY_RUNNER),
    "runner": Neutral(_one_of("auto", "generate", "pooling"), _ANY_RUNNER),
    "convert": Neutral(_one_of("auto", "none", "embed"), _ANY_RUNNER),
    "compilation_config": Neutral(
        _one_of(None), "CUDA graphs and fused Triton kernels; see cuda_graphs and graph_batch_sizes"
    ),
    "hf_overrides": Neutral(_one_of(None), "the checkpoint's config.json is read as it is"),
    "lora_dtype": Neutral(_one_of(None, "auto"), "adapters run in the model's dtype"),
    "load_format": Neutral(_one_of("auto", "safetensors"), "weights load from the checkpoint's safetensors"),
    "served_model_name": Neutral(
        lambda v: (
            v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(n, str) for n in v))
        ),
        "offline it names nothing; the server's --served-model-name names the model there",
    ),
    "enable_sleep_mode": Neutral(_one_of(False), "the engine keeps its weights and KV cache on the device"),
    "async_scheduling": Neutral(_bool, "the host always schedules and stages step n+1 while step n runs"),
    "speculative_config": Neutral(_one_of(None), "no speculative decoding"),
    "model_impl": Neutral(_one_of("auto"), "fastpath's own model code"),
    "logits_processors": Neutral(lambda v: v is None or v == [], "no custom logits processors"),
    "limit_mm_per_prompt": Neutral(lambda v: v is None or v == {}, "text-only models"),
    "kv_cache_memory_bytes": Neutral(
        _one_of(None), "the KV cache is sized by gpu_memory_utilization, or kv_cache_blocks"
    ),
    "override_generation_config": Neutral(
        lambda v: v is None or v == {}, "sampling defaults come from generation_config"
    ),
    "fully_sharded_loras": Neutral(
        _one_of(False), "under tensor parallelism each rank holds the slice of B (or A) its shard needs"
    ),
}


def check(key: str, value: Any) -> None:
    """Accept vLLM's `key=value` where it asks for what fastpath does, else a ValueError saying what
    fastpath does."""
    rule = NEUTRAL[key]
    if not rule.accepts(value):
        raise ValueError(f"LLM({key}={value!r}) is not supported: {rule.does}")


def check_call(
    *,
    priority: Any = None,
    chat_template_content_format: str = "auto",
    mm_processor_kwargs: Any = None,
) -> None:
    """vLLM's generate() and chat() keywords, accepted where they ask for what fastpath does."""
    if priority is not None and any(p != 0 for p in priority):
        # vLLM refuses it too unless its scheduler runs the priority policy, which fastpath's has not.
        raise ValueError("priority is not supported: requests are scheduled first come, first served")
    if chat_template_content_format not in ("auto", "string"):
        raise ValueError(
            f"chat_template_content_format={chat_template_content_format!r} is not supported: text parts are "
            "joined into one string ('auto' and 'string' do that)"
        )
    if mm_processor_kwargs:
        raise ValueError("mm_processor_kwargs is not supported: this engine's models take text only")
