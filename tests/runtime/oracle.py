"""HF transformers as the external oracle: greedy tokens and the top-2 logit margin at each step."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def hf_model(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def hf_greedy(path, prompt: list[int], n: int, dtype=torch.float32, device="cpu") -> list[int]:
    return greedy_tokens(hf_model(str(path), dtype, device), prompt, n)


@torch.no_grad()
def greedy_tokens(model, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens of an HF model after `prompt`, no EOS stopping them."""
    device = next(model.parameters()).device
    out = model.generate(
        torch.tensor([prompt], device=device),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@torch.no_grad()
def hf_margins(
    path, prompt: list[int], continuation: list[int], dtype=torch.float32, device="cpu"
) -> list[float]:
    """Top-1 minus top-2 logit at each generated position, from one teacher-forced forward."""
    model = hf_model(str(path), dtype, device)
    ids = torch.tensor([prompt + continuation], device=device)
    logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(continuation)].float()
    top2 = logits.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


@torch.no_grad()
def hf_logits_first_step(path, prompt: list[int], dtype=torch.float32, device="cpu") -> torch.Tensor:
    model = hf_model(str(path), dtype, device)
    return model(torch.tensor([prompt], device=device)).logits[0, -1].float().cpu()
