"""The names a manifest may use: fastpath.vocab's, which every layer shares."""

from fastpath.vocab import (
    DEFAULT_FMHA_ORDER,
    DISPATCH_MODES,
    DISTRIBUTION,
    EXECUTOR_EVENTS,
    FMHA_LIBRARIES,
    GUIDED_BACKENDS,
    LLM_INT_BOUNDS,
    LOOP_VS_GUIDED,
    ON_UNSUPPORTED,
    RANDOM_PREFIX,
    RANDOM_PRESETS,
    SCHEMA_VERSION,
)

__all__ = [
    "DEFAULT_FMHA_ORDER",
    "DISPATCH_MODES",
    "DISTRIBUTION",
    "EXECUTOR_EVENTS",
    "FMHA_LIBRARIES",
    "GUIDED_BACKENDS",
    "LLM_INT_BOUNDS",
    "LOOP_VS_GUIDED",
    "ON_UNSUPPORTED",
    "RANDOM_PREFIX",
    "RANDOM_PRESETS",
    "SCHEMA_VERSION",
]
