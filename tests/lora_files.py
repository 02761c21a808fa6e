"""LoRA adapters in PEFT's file layout with random weights, and an oracle, without peft (the GPU
machine has none; tests/runtime/test_lora.py checks the engine against PEFT itself)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fastpath.runtime.model.config import ModelConfig
from fastpath.runtime.model.random_adapter import write_random_adapter


def write_adapter(base: Path, path: Path, seed: int, r: int, modules: list[str], **config) -> str:
    return write_random_adapter(ModelConfig.from_dir(base), path, seed, r, modules, **config)


@torch.no_grad()
def merged_greedy(
    base: Path, adapter: str | None, prompt: list[int], n: int, device: str = "cpu"
) -> list[int]:
    """Greedy tokens of HF transformers' model with the adapter merged into its weights
    (W + alpha / r * B @ A, as PEFT's merge does): an oracle that needs no peft."""
    import transformers
    from safetensors.torch import load_file

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        conf = json.loads((Path(adapter) / "adapter_config.json").read_text())
        weights = load_file(str(Path(adapter) / "adapter_model.safetensors"))
        modules = dict(model.named_modules())
        for name, a in weights.items():
            if ".lora_A." not in name:
                continue
            b = weights[name.replace(".lora_A.", ".lora_B.")]
            r = a.shape[0]
            scale = conf["lora_alpha"] / (r**0.5 if conf.get("use_rslora") else r)
            target = name.removeprefix("base_model.model.").split(".lora_A.")[0]
            modules[target].weight += scale * b @ a
    model = model.to(device).eval()
    out = model.generate(
        torch.tensor([prompt], device=device),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()
