"""The names a manifest may use: fastpath.vocab's, which every layer shares."""

from fastpath.vocab import (
    CATALOG_MODELS,
    DEFAULT_FMHA_ORDER,
    DISPATCH_MODES,
    EXECUTOR_EVENTS,
    FMHA_LIBRARIES,
    GUIDED_BACKENDS,
    LOOP_VS_GUIDED,
    ON_UNSUPPORTED,
    RANDOM_PREFIX,
    RANDOM_PRESETS,
    SCHEMA_VERSION,
)

__all__ = [
    "CATALOG_MODELS",
    "DEFAULT_FMHA_ORDER",
    "DISPATCH_MODES",
    "EXECUTOR_EVENTS",
    "FMHA_LIBRARIES",
    "GUIDED_BACKENDS",
    "LOOP_VS_GUIDED",
    "ON_UNSUPPORTED",
    "RANDOM_PREFIX",
    "RANDOM_PRESETS",
    "SCHEMA_VERSION",
]
