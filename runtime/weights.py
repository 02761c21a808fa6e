"""Weights into the model: from HF safetensors (single file or sharded), or seeded random."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig
from .model import CausalLM
from .progress import progress


class WeightError(ValueError):
    """A checkpoint that does not match its config; the message names the tensor."""


def _sources(cfg: ModelConfig) -> dict[str, list[str]]:
    """Our parameter name -> the HF tensors concatenated (dim 0) to make it."""
    out: dict[str, list[str]] = {
        "embed_tokens.weight": ["model.embed_tokens.weight"],
        "norm.weight": ["model.norm.weight"],
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ["lm_head.weight"]
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        attn = f"{hf}.self_attn"
        out[f"{ours}.self_attn.qkv_proj.weight"] = [f"{attn}.{p}_proj.weight" for p in "qkv"]
        if cfg.qkv_bias:
            out[f"{ours}.self_attn.qkv_proj.bias"] = [f"{attn}.{p}_proj.bias" for p in "qkv"]
        out[f"{ours}.self_attn.o_proj.weight"] = [f"{attn}.o_proj.weight"]
        if cfg.o_bias:
            out[f"{ours}.self_attn.o_proj.bias"] = [f"{attn}.o_proj.bias"]
        if cfg.qk_norm:
            out[f"{ours}.self_attn.q_norm.weight"] = [f"{attn}.q_norm.weight"]
            out[f"{ours}.self_attn.k_norm.weight"] = [f"{attn}.k_norm.weight"]
        out[f"{ours}.mlp.gate_up_proj.weight"] = [f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"]
        out[f"{ours}.mlp.down_proj.weight"] = [f"{hf}.mlp.down_proj.weight"]
        out[f"{ours}.input_layernorm.weight"] = [f"{hf}.input_layernorm.weight"]
        out[f"{ours}.post_attention_layernorm.weight"] = [f"{hf}.post_attention_layernorm.weight"]
    return out


def _tensor_files(path: Path) -> dict[str, Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    single = path / "model.safetensors"
    if not single.is_file():
        raise WeightError(f"{path}: neither model.safetensors nor model.safetensors.index.json")
    with safe_open(single, framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def _iter_params(model: CausalLM) -> Iterator[tuple[str, torch.nn.Parameter]]:
    seen = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) not in seen and not name.startswith("rope"):
            seen.add(id(param))
            yield name, param


@torch.no_grad()
def load_checkpoint(model: CausalLM, path: str | Path) -> None:
    path = Path(path)
    files = _tensor_files(path)
    sources = _sources(model.cfg)
    params = dict(_iter_params(model))
    missing = sorted({s for srcs in sources.values() for s in srcs if s not in files})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise WeightError(f"{path}: missing tensor {shown}")
    with ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(f, framework="pt")) for f in sorted(set(files.values()))}
        for ours, srcs in progress(sources.items(), f"loading {path.name}", total=len(sources)):
            parts = [handles[files[s]].get_tensor(s) for s in srcs]
            param = params[ours]
            expected = [*param.shape]
            got = [sum(p.shape[0] for p in parts), *parts[0].shape[1:]]
            if got != expected or any(p.shape[1:] != parts[0].shape[1:] for p in parts):
                shapes = ", ".join(f"{s} {tuple(p.shape)}" for s, p in zip(srcs, parts, strict=True))
                raise WeightError(
                    f"{path}: shape mismatch for {shapes}; the config expects {tuple(expected)}"
                )
            param.copy_(torch.cat(parts) if len(parts) > 1 else parts[0])


@torch.no_grad()
def init_random(model: CausalLM, seed: int) -> None:
    """Seeded normal weights scaled by fan-in, norms near one: varied tokens, finite in every dtype."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in progress(list(_iter_params(model)), "random weights"):
        if "norm" in name:
            value = 1.0 + 0.1 * torch.randn(param.shape, generator=gen, device=device)
        elif param.dim() == 1:
            value = 0.02 * torch.randn(param.shape, generator=gen, device=device)
        else:  # embeddings too: tied to the LM head, they must not dominate its logits
            value = torch.randn(param.shape, generator=gen, device=device) * param.shape[1] ** -0.5
        param.copy_(value)


def build_model(
    cfg: ModelConfig,
    checkpoint: Path | None,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    fused_kernels: bool | None = None,
):
    """The model on `device` in `dtype`, weights loaded or seeded; never materialised twice."""
    from .kernels import select_ops
    from .layers import RotaryEmbedding

    with torch.device("meta"):
        model = CausalLM(cfg, max_positions=1)
    model = model.to(dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    with torch.device(device):
        model.rope = RotaryEmbedding(cfg, max_positions)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint)
    else:
        init_random(model, cfg.random_seed or 0)
    model.ops = select_ops(device.type, fused_kernels)
    return model.eval().requires_grad_(False)
