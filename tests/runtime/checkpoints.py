"""Tiny HF checkpoints built at test time with transformers' save_pretrained: the oracle's own files."""

from __future__ import annotations

from pathlib import Path

import torch

ARCHS = {
    "llama": dict(
        cls="LlamaForCausalLM",
        cfg="LlamaConfig",
        extra=dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        ),
    ),
    "llama-tied-mqa": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", extra=dict(tie_word_embeddings=True), kv_heads=1
    ),
    "qwen2": dict(cls="Qwen2ForCausalLM", cfg="Qwen2Config", extra={}),
    "qwen3": dict(cls="Qwen3ForCausalLM", cfg="Qwen3Config", extra=dict(head_dim=16)),
    "mistral": dict(cls="MistralForCausalLM", cfg="MistralConfig", extra=dict(sliding_window=24)),
}


def build_checkpoint(root: Path, arch: str, seed: int = 0, vocab: int = 384) -> Path:
    import transformers

    spec = ARCHS[arch]
    cfg = getattr(transformers, spec["cfg"])(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=spec.get("kv_heads", 2),
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        **spec["extra"],
    )
    torch.manual_seed(seed)
    model = getattr(transformers, spec["cls"])(cfg)
    with torch.no_grad():
        # HF's init leaves tiny residual updates, so greedy decoding just repeats: widen it.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    path = root / arch
    model.save_pretrained(path)
    return path
