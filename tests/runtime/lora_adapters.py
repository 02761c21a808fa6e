"""PEFT adapters built at test time with peft itself; PEFT's own generate as the oracle, and HF's
model with an adapter merged into its weights, which needs no peft (the GPU machine has none)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from oracle import greedy_tokens

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapter(base: Path, out: Path, seed: int, r: int, targets: list[str], **config) -> Path:
    """A LoRA adapter of `base` with random A and B (PEFT starts B at zero, which would change nothing)."""
    import peft
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = peft.LoraConfig(r=r, lora_alpha=config.pop("lora_alpha", 2 * r), target_modules=targets, **config)
    model = peft.get_peft_model(model, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    model.save_pretrained(out)
    return out


@functools.lru_cache(maxsize=16)
def peft_model(base: str, adapter: str | None):
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return (peft.PeftModel.from_pretrained(model, adapter) if adapter else model).eval()


def peft_greedy(base, adapter, prompt: list[int], n: int) -> list[int]:
    return greedy_tokens(peft_model(str(base), str(adapter) if adapter else None), prompt, n)


@torch.no_grad()
def merged_model(base: Path, adapter: str | None):
    """HF transformers' model with the adapter merged into its weights (W + alpha / r * B @ A, as
    PEFT's merge does): an oracle that needs no peft."""
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
    return model.eval()


def merged_greedy(
    base: Path, adapter: str | None, prompt: list[int], n: int, device: str = "cpu"
) -> list[int]:
    """Greedy tokens of the merged model (merged_model)."""
    return greedy_tokens(merged_model(base, adapter).to(device), prompt, n)
