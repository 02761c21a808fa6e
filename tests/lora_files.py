"""LoRA adapters in PEFT's file layout with random weights, written without peft (the GPU machine and
the server tests need none; tests/runtime/lora_adapters.py has the oracles)."""

from __future__ import annotations

from pathlib import Path

from fastpath.runtime.model.config import ModelConfig
from fastpath.runtime.model.random_adapter import write_random_adapter


def write_adapter(base: Path, path: Path, seed: int, r: int, modules: list[str], **config) -> str:
    return write_random_adapter(ModelConfig.from_dir(base), path, seed, r, modules, **config)
