"""The model's own sampling defaults, from its generation_config.json, as vLLM takes them by default
(`generation_config="auto"`): a request that leaves temperature, top_p, top_k, min_p,
repetition_penalty or max_tokens unset gets the model's value. Llama 3 instruct ships temperature 0.6
and top_p 0.9, so the same checkpoint samples the same way here as under vLLM.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .sampling_params import SamplingParams

log = logging.getLogger("fastpath")

# generation_config.json key -> SamplingParams field (vLLM's set)
KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
SOURCES = ("auto", "vllm")


def generation_defaults(setting: str | Path, checkpoint: Path | None) -> dict[str, Any]:
    """SamplingParams keywords: the model's ("auto"), none ("vllm": SamplingParams' own), or those of
    the generation_config.json in a folder given by path. A file that does not parse or gives values
    SamplingParams refuses is a ValueError naming it."""
    if not isinstance(setting, (str, Path)):
        raise ValueError(f"generation_config must be auto, vllm or a folder, got {setting!r}")
    if setting == "vllm":
        return {}
    folder = checkpoint if setting == "auto" else Path(setting)
    if folder is None:
        return {}
    path = folder / "generation_config.json"
    if not path.is_file():
        if setting != "auto":
            raise ValueError(f"generation_config: {path} does not exist")
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"generation_config: {path}: {exc}") from None
    picked = {
        field: raw[key] for key, field in KEYS.items() if isinstance(raw, dict) and raw.get(key) is not None
    }
    try:
        SamplingParams(**picked)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"generation_config: {path}: {exc}") from None
    if picked:
        log.info("sampling defaults from %s: %s (generation_config='vllm' ignores them)", path, picked)
    return picked
