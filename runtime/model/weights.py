"""Weights into the model: from HF safetensors (single file or sharded), or seeded random; one rank's slices under TP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from ..progress import progress
from .causal_lm import CausalLM
from .checkpoint_map import param_slices
from .collectives import SINGLE, TPContext
from .config import ModelConfig


class WeightError(ValueError):
    """A checkpoint that does not match its config; the message names the tensor."""


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
    """Each parameter from its HF tensors; a tensor-parallel rank reads only its slices of them."""
    path = Path(path)
    files = _tensor_files(path)
    plan = param_slices(model.cfg, model.part)
    params = dict(_iter_params(model))
    missing = sorted({p.source for sl in plan.values() for p in sl.pieces if p.source not in files})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise WeightError(f"{path}: missing tensor {shown}")
    with ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(f, framework="pt")) for f in sorted(set(files.values()))}
        for ours, sl in progress(plan.items(), f"loading {path.name}", total=len(plan)):
            slices = {p.source: handles[files[p.source]].get_slice(p.source) for p in sl.pieces}
            wrong = [(n, tuple(s.get_shape())) for n, s in slices.items()]
            if any(shape != p.source_shape for (_, shape), p in zip(wrong, sl.pieces, strict=True)):
                shapes = ", ".join(f"{n} {shape}" for n, shape in wrong)
                raise WeightError(f"{path}: shape mismatch for {shapes}; the config expects {sl.full_shape}")
            if sl.zeros:
                params[ours].zero_()
                continue
            parts = [_read(slices[p.source], sl.dim, p.start, p.stop) for p in sl.pieces]
            _assign(params[ours], torch.cat(parts, dim=sl.dim) if len(parts) > 1 else parts[0])


def _read(tensor_slice, dim: int, start: int, stop: int) -> torch.Tensor:
    return tensor_slice[start:stop] if dim == 0 else tensor_slice[:, start:stop]


def _assign(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Copy a rank's slice in; rows past it (vocabulary padding) are zeroed."""
    rows = value.shape[0]
    param[:rows].copy_(value)
    if rows < param.shape[0]:
        param[rows:].zero_()


@torch.no_grad()
def init_random(model: CausalLM, seed: int) -> None:
    """Seeded normal weights scaled by fan-in, norms near one: varied tokens, finite in every dtype.

    Every rank draws each whole tensor, as one rank would, and keeps its slice: the same model at any
    tensor-parallel size.
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    plan = param_slices(model.cfg, model.part)
    for name, param in progress(list(_iter_params(model)), "random weights"):
        sl = plan[name]
        shape = sl.full_shape
        if "norm" in name:
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen, device=device)
        elif len(shape) == 1:
            value = 0.02 * torch.randn(shape, generator=gen, device=device)
        else:  # embeddings too: tied to the LM head, they must not dominate its logits
            value = torch.randn(shape, generator=gen, device=device) * shape[1] ** -0.5
        if sl.zeros:
            param.zero_()
            continue
        parts = [value.narrow(sl.dim, p.offset + p.start, p.stop - p.start) for p in sl.pieces]
        _assign(param, torch.cat(parts, dim=sl.dim) if len(parts) > 1 else parts[0])


def build_model(
    cfg: ModelConfig,
    checkpoint: Path | None,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    fused_kernels: bool | None = None,
    tp: TPContext = SINGLE,
):
    """The model (this rank's shard of it) on `device` in `dtype`, weights loaded or seeded; never materialised twice."""
    from ..kernels import select_ops
    from .layers import RotaryEmbedding

    with torch.device("meta"):
        model = CausalLM(cfg, max_positions=1, tp=tp)
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
