"""PEFT adapters built at test time with peft itself, and PEFT's own generate as the oracle."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

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


@torch.no_grad()
def peft_greedy(base, adapter, prompt: list[int], n: int) -> list[int]:
    model = peft_model(str(base), str(adapter) if adapter else None)
    out = model.generate(
        input_ids=torch.tensor([prompt]),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()
