"""A LoRA adapter with seeded random weights in PEFT's file layout, for tests and benchmarks (as
tiny_checkpoint.py writes random checkpoints): what `peft.save_pretrained` would write for an adapter
whose A and B are both trained away from their initial values."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .config import ModelConfig
from .lora_adapter import CONFIG_FILE, PARTS, WEIGHTS_FILE


def write_random_adapter(
    cfg: ModelConfig, path: str | Path, seed: int, r: int, modules: list[str], std: float = 0.5, **config
) -> str:
    """Adapter folder `path` for `cfg` of rank `r` on `modules` (HF names: q_proj, ..., down_proj);
    `config` adds adapter_config.json fields (use_rslora, lora_alpha, ...). Returns the path."""
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
              "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}  # fmt: skip
    mlp = PARTS["gate_up"] + PARTS["down"]
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_layers):
        for m in modules:
            out, inp = shapes[m]
            key = f"base_model.model.model.layers.{layer}.{'mlp' if m in mlp else 'self_attn'}.{m}"
            # A scaled by the width it reads, so the delta's size does not grow with the model
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, inp, generator=g) * std * (64 / inp) ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, r, generator=g) * std
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / WEIGHTS_FILE))
    fields = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": 2 * r,
        "target_modules": list(modules),
        "bias": "none",
    }
    (path / CONFIG_FILE).write_text(json.dumps({**fields, **config}, indent=2))
    return str(path)
