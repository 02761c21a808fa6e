"""Model configuration: what the engine needs from an HF `config.json`, and seeded random presets."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# HF `architectures` / `model_type` -> the family switches this engine implements.
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_MODEL_TYPES = {v: v for v in _ARCHITECTURES.values()}


class ConfigError(ValueError):
    """A config.json this engine cannot run; the message names the field."""


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3.x frequency scaling (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    family: str  # llama | mistral | qwen2 | qwen3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2; Llama with attention_bias
    o_bias: bool = False  # Llama with attention_bias
    qk_norm: bool = False  # Qwen3
    sliding_window: int | None = None  # Mistral v0.1
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Set for seeded random weights (tests, benchmarks); None for a checkpoint.
    random_seed: int | None = None
    name: str = field(default="model", compare=False)

    def __post_init__(self) -> None:
        if self.family not in _MODEL_TYPES:
            raise ConfigError(f"family: unknown model family {self.family!r}; known: {sorted(_MODEL_TYPES)}")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_key_value_heads: {self.num_kv_heads} does not divide num_attention_heads {self.num_heads}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        per_layer = attn + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_layers * per_layer + h + head

    # --- HF config.json -------------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "model") -> ModelConfig:
        archs = d.get("architectures") or []
        family = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
        family = family or _MODEL_TYPES.get(d.get("model_type", ""))
        if family is None:
            raise ConfigError(
                f"architectures: {archs or d.get('model_type')!r} is not supported; "
                f"supported: {sorted(_ARCHITECTURES)}"
            )

        def need(key: str) -> Any:
            if key not in d:
                raise ConfigError(f"{key}: missing from config.json")
            return d[key]

        num_heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        head_dim = d.get("head_dim") or hidden // num_heads
        rope = d.get("rope_parameters") or {}
        legacy_scaling = d.get("rope_scaling") or {}
        rope_theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        scaling_src = rope if rope.get("rope_type", "default") != "default" else legacy_scaling
        rope_type = scaling_src.get("rope_type", scaling_src.get("type", "default"))
        scaling = None
        if rope_type == "llama3":
            scaling = RopeScaling(
                factor=float(scaling_src["factor"]),
                low_freq_factor=float(scaling_src["low_freq_factor"]),
                high_freq_factor=float(scaling_src["high_freq_factor"]),
                original_max_position_embeddings=int(scaling_src["original_max_position_embeddings"]),
            )
        elif rope_type not in ("default", None):
            raise ConfigError(
                f"rope_scaling: rope_type {rope_type!r} is not supported (supported: default, llama3)"
            )
        if family == "qwen2" and d.get("use_sliding_window"):
            raise ConfigError("use_sliding_window: Qwen2 sliding-window layers are not supported")
        if d.get("mlp_bias"):
            raise ConfigError("mlp_bias: MLP biases are not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act: {d['hidden_act']!r} is not supported (silu only)")
        sliding = d.get("sliding_window") if family == "mistral" else None
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            family=family,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(d.get("attention_bias", False)),
            o_bias=family == "llama" and bool(d.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            sliding_window=int(sliding) if sliding else None,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            name=name,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ConfigError(f"{cfg}: no config.json in the checkpoint directory")
        return cls.from_hf_dict(json.loads(cfg.read_text()), name=path.name)

    def to_hf_dict(self) -> dict[str, Any]:
        """The transformers config of this model, for building test checkpoints and the HF oracle."""
        arch = {v: k for k, v in _ARCHITECTURES.items()}[self.family]
        d: dict[str, Any] = {
            "architectures": [arch],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids)
            if len(self.eos_token_ids) > 1
            else next(iter(self.eos_token_ids), None),
            "hidden_act": "silu",
        }
        rope: dict[str, Any] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling is not None:
            rope |= {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        d["rope_parameters"] = rope
        if self.family == "llama":
            d["attention_bias"] = self.o_bias
        if self.family == "mistral":
            d["sliding_window"] = self.sliding_window
        return d
