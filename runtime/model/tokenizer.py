"""The checkpoint's tokenizer, when it has one; prompts as token ids always work without it."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("fastpath.tokenizer")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def load_tokenizer(path: Path | None) -> Any | None:
    if path is None or not any((path / f).is_file() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def generation_eos_ids(path: Path | None) -> set[int]:
    """Extra end-of-sequence ids from generation_config.json (Llama 3 instruct lists several)."""
    if path is None or not (path / "generation_config.json").is_file():
        return set()
    eos = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {int(eos)}


# Random presets this small get a byte-level BPE trained at load time, so text works in tests and demos.
SYNTHETIC_TOKENIZER_MAX_VOCAB = 4096


@functools.lru_cache(maxsize=4)
def _synthetic(vocab_size: int) -> Any:
    from .tiny_checkpoint import train_tokenizer

    return train_tokenizer(vocab_size)


def resolve_tokenizer(tokenizer: Path | None, checkpoint: Path | None, vocab_size: int) -> Any | None:
    """The tokenizer named, else the checkpoint's, else a trained one for a small random model, else None."""
    if tokenizer is not None:
        found = load_tokenizer(tokenizer)
        if found is None:
            raise ValueError(f"tokenizer {str(tokenizer)!r}: no tokenizer files there")
        return found
    if checkpoint is not None:
        return load_tokenizer(checkpoint)
    return _synthetic(vocab_size) if vocab_size <= SYNTHETIC_TOKENIZER_MAX_VOCAB else None
