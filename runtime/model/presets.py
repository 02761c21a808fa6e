"""Named random-weight model configs, for tests and benchmarks (`random:<preset>`)."""

from __future__ import annotations

from fastpath.vocab import RANDOM_PREFIX

from .config import ModelConfig, RopeScaling

_TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=160,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    bos_token_id=1,
    eos_token_ids=(2,),
)

PRESETS: dict[str, ModelConfig] = {
    "tiny-llama": ModelConfig(
        family="llama",
        rope_theta=500000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64),
        tie_word_embeddings=True,
        name="tiny-llama",
        **_TINY,
    ),
    "tiny-qwen2": ModelConfig(family="qwen2", qkv_bias=True, rms_norm_eps=1e-6, name="tiny-qwen2", **_TINY),
    "tiny-qwen3": ModelConfig(family="qwen3", qk_norm=True, rms_norm_eps=1e-6, name="tiny-qwen3", **_TINY),
    "tiny-mistral": ModelConfig(family="mistral", sliding_window=4096, name="tiny-mistral", **_TINY),
    # The 1.2B Llama of the benchmarks (Llama 3.2 1B's shape).
    "llama-1b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192),
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        name="llama-1b",
    ),
    # An 8B-class Llama (Llama 3.1 8B's shape), where tensor parallelism is measured.
    "llama-8b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192),
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        name="llama-8b",
    ),
}


def resolve_random(spec: str, seed: int = 0) -> ModelConfig:
    """`random:tiny-llama` -> its config with random weights seeded by `seed`."""
    name = spec.removeprefix(RANDOM_PREFIX)
    if name not in PRESETS:
        raise ValueError(f"model {spec!r}: unknown random preset; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name].replace(random_seed=seed)
