"""The names a manifest may use. Plain constants: the runtime imports them without pydantic."""

SCHEMA_VERSION = 1

# Every FMHA library a manifest may name. The runtime's registry must know exactly these.
FMHA_LIBRARIES: tuple[str, ...] = (
    "reference",
    "sdpa_flash",
    "sdpa_efficient",
    "sdpa_cudnn",
    "sdpa_math",
    "flex_attention",
    "flashinfer",
    "triton_decode",
)

# The order the runtime tries libraries in when a manifest leaves `fmha.enabled` out:
# fastest first, the reference last so that something always supports a call.
DEFAULT_FMHA_ORDER: tuple[str, ...] = (
    "triton_decode",
    "flashinfer",
    "sdpa_flash",
    "sdpa_cudnn",
    "sdpa_efficient",
    "sdpa_math",
    "flex_attention",
    "reference",
)

RANDOM_PREFIX = "random:"
# `random:<preset>` checkpoints: seeded random weights in a known shape, for tests and benchmarks.
RANDOM_PRESETS: tuple[str, ...] = ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "llama-1b")

# Executor events a manifest may hook, in the order the executor reaches them.
EXECUTOR_EVENTS: tuple[str, ...] = ("after_warmup", "before_overlap_loop", "at_shutdown")
