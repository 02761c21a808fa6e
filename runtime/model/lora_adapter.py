"""A PEFT LoRA adapter, read and checked against the model: adapter_config.json and
adapter_model.safetensors, as `peft.save_pretrained` writes them.

Each targeted projection `p` of layer `i` adds `scale * B @ A @ x` to its output, with A [r, in] and
B [out, r], `scale` = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). The scale is folded
into B as it is read. Projections the adapter does not target add nothing.

Only what the engine can apply is accepted: the seven linear projections of the decoder layers. An
adapter that trains other modules (embeddings, the LM head, `modules_to_save`), uses DoRA or trains
biases is refused with a message naming what it holds.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig

# Our fused projections and the HF modules each is made of, in the order they are stacked.
PROJECTIONS = ("qkv", "o", "gate_up", "down")
PARTS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}  # fmt: skip
MODULES = {m: p for p, ms in PARTS.items() for m in ms}
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$"
)


# PEFT's LoRA options that change what the adapter computes beyond B @ A: refused by name rather
# than run as a plain LoRA with silently other tokens.
UNSUPPORTED = {
    "use_dora": "DoRA adapters",
    "alora_invocation_tokens": "activated LoRA (aLoRA) adapters",
    "lora_bias": "adapters with a bias on lora_B",
    "layer_replication": "adapters that replicate layers",
    "trainable_token_indices": "adapters that train token embeddings",
    "arrow_config": "Arrow routing between adapters",
    "use_bdlora": "block-diagonal LoRA adapters",
}


class AdapterError(ValueError):
    """An adapter the engine cannot apply; the message names the adapter and what is wrong."""


@dataclass(frozen=True, slots=True)
class AdapterHeader:
    """What admission checks without reading any weights."""

    path: Path
    rank: int  # the largest rank of any module
    scales: dict[tuple[int, str], float]  # (layer, HF module) -> alpha / r (or / sqrt(r))
    tensors: dict[tuple[int, str, str], str]  # (layer, HF module, "A" | "B") -> tensor name


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each HF module, unsharded."""
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}  # fmt: skip


def _pattern_value(where: str, patterns: dict, layer: int, module: str, default: float) -> float:
    """PEFT's alpha_pattern: the first key that matches the module's name as PEFT matches it (the
    key a regex for the name's tail)."""
    name = f"model.layers.{layer}.{'mlp' if module in PARTS['gate_up'] + PARTS['down'] else 'self_attn'}.{module}"
    for key, value in patterns.items():
        try:
            hit = name == key or re.match(rf"(.*\.)?({key})$", name) is not None
        except re.error as exc:
            raise AdapterError(
                f"{where}: alpha_pattern key {key!r} is not a regular expression: {exc}"
            ) from None
        if hit:
            return value
    return default


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_header(path: str | Path, cfg: ModelConfig, max_rank: int) -> AdapterHeader:
    """The adapter's config and tensor names and shapes, checked against `cfg` and `max_rank`."""
    path = Path(path)
    where = f"LoRA adapter {str(path)!r}"
    config_file, weights_file = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not config_file.is_file():
        raise AdapterError(f"{where}: no {CONFIG_FILE} (a PEFT adapter folder holds one)")
    if not weights_file.is_file():
        other = (
            " (adapter_model.bin is not read: save it as safetensors)"
            if (path / "adapter_model.bin").is_file()
            else ""
        )
        raise AdapterError(f"{where}: no {WEIGHTS_FILE}{other}")
    try:
        conf = json.loads(config_file.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise AdapterError(f"{where}: {CONFIG_FILE} is not JSON: {exc}") from None
    if not isinstance(conf, dict):
        raise AdapterError(f"{where}: {CONFIG_FILE} must hold an object")
    if conf.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{where}: peft_type {conf['peft_type']!r} is not LORA")
    for key, what in UNSUPPORTED.items():
        if conf.get(key) not in (None, False, [], {}):
            raise AdapterError(f"{where}: {what} ({key}={conf[key]!r:.60}) are not supported")
    if conf.get("bias", "none") != "none":
        raise AdapterError(f"{where}: bias={conf['bias']!r} trains biases; only bias='none' is supported")
    if conf.get("modules_to_save"):
        raise AdapterError(f"{where}: modules_to_save {conf['modules_to_save']} are not supported")
    if conf.get("fan_in_fan_out"):
        raise AdapterError(f"{where}: fan_in_fan_out is for Conv1D models, not Llama-family ones")
    alpha = conf.get("lora_alpha", 8)  # PEFT's default
    rslora = bool(conf.get("use_rslora", False))
    alphas = conf.get("alpha_pattern") or {}
    if not _number(alpha):
        raise AdapterError(f"{where}: lora_alpha must be a number, got {alpha!r}")
    if not isinstance(alphas, dict) or not all(isinstance(k, str) and _number(v) for k, v in alphas.items()):
        raise AdapterError(f"{where}: alpha_pattern must map module names to numbers, got {alphas!r}")
    shapes = _expected_shapes(cfg)
    tensors: dict[tuple[int, str, str], str] = {}
    found: dict[str, tuple[int, ...]] = {}
    try:
        with safe_open(weights_file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                found[name] = tuple(f.get_slice(name).get_shape())
    except Exception as exc:
        raise AdapterError(f"{where}: {WEIGHTS_FILE} cannot be read: {exc}") from exc
    for name, shape in found.items():
        m = _KEY.match(name)
        if m is None or m.group(2) not in MODULES:
            raise AdapterError(
                f"{where}: tensor {name!r} is not a LoRA weight of a decoder projection "
                f"({', '.join(MODULES)}); adapters of other modules are not supported"
            )
        layer, module, ab = int(m.group(1)), m.group(2), m.group(3)
        if layer >= cfg.num_layers:
            raise AdapterError(
                f"{where}: tensor {name!r} names layer {layer}; the model has {cfg.num_layers}"
            )
        if len(shape) != 2:
            raise AdapterError(f"{where}: tensor {name!r} has shape {shape}; a LoRA weight is 2-D")
        tensors[(layer, module, ab)] = name
    scales: dict[tuple[int, str], float] = {}
    rank = 0
    for (layer, module, ab), name in sorted(tensors.items()):
        if ab != "A":
            continue
        b_name = tensors.get((layer, module, "B"))
        if b_name is None:
            raise AdapterError(f"{where}: {name!r} has no lora_B beside it")
        out, inp = shapes[module]
        r = found[name][0]
        if r < 1:
            raise AdapterError(f"{where}: {name!r} has rank {r}; a LoRA weight's rank is at least 1")
        if found[name] != (r, inp) or found[b_name] != (out, r):
            raise AdapterError(
                f"{where}: {name!r} is {found[name]} and {b_name!r} is {found[b_name]}; this model's "
                f"{module} needs ({r}, {inp}) and ({out}, {r})"
            )
        if r > max_rank:
            raise AdapterError(
                f"{where}: {module} of layer {layer} has rank {r}, above max_lora_rank {max_rank}"
            )
        a = _pattern_value(where, alphas, layer, module, alpha)
        scales[(layer, module)] = a / (math.sqrt(r) if rslora else r)
        rank = max(rank, r)
    lone = [n for (layer, module, ab), n in tensors.items() if ab == "B" and (layer, module) not in scales]
    if lone:
        raise AdapterError(f"{where}: {lone[0]!r} has no lora_A beside it")
    if not scales:
        raise AdapterError(f"{where}: {WEIGHTS_FILE} holds no LoRA weights")
    return AdapterHeader(path, rank, scales, tensors)


def read_weights(
    header: AdapterHeader, dtype: torch.dtype
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, HF module) -> (A [r, in], scale * B [out, r]) in `dtype`, on the CPU, unsharded. A NaN or
    inf is refused: in the masked matmuls it would reach every row (NaN * 0 is NaN)."""
    out = {}
    where = f"LoRA adapter {str(header.path)!r}"
    try:
        f = safe_open(header.path / WEIGHTS_FILE, framework="pt")
    except Exception as exc:
        raise AdapterError(f"{where}: {WEIGHTS_FILE} cannot be read: {exc}") from exc
    with f:
        for (layer, module), scale in header.scales.items():
            pair = []
            for ab in "AB":
                name = header.tensors[(layer, module, ab)]
                try:
                    t = f.get_tensor(name).float()
                except Exception as exc:
                    raise AdapterError(f"{where}: tensor {name!r} cannot be read: {exc}") from exc
                t = t * scale if ab == "B" else t
                t = t.to(dtype)
                if not torch.isfinite(t).all():
                    raise AdapterError(f"{where}: tensor {name!r} holds NaN or inf (in {dtype})")
                pair.append(t)
            out[(layer, module)] = (pair[0], pair[1])
    return out


def load_adapter(path: str | Path, cfg: ModelConfig, max_rank: int, dtype: torch.dtype):
    """read_header then read_weights: an adapter's weights, checked, on the CPU."""
    return read_weights(read_header(path, cfg, max_rank), dtype)
