"""Write a random-weight model as an HF checkpoint directory, optionally with a trained byte-level BPE tokenizer.

Tests, the demo and guided decoding use it to have text in and out with no download.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .checkpoint_map import param_slices
from .config import ModelConfig
from .sharding import partition
from .weights import build_model

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    '{"name": "fastpath", "version": 1, "tags": ["llm", "compiler"], "ok": true, "score": 0.5}',
    "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]",
    "Decode steps replay CUDA graphs; host callbacks run from the stream.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789",
    '{"a": {"b": [null, false, -1.25e3]}, "c": "d e f"}',
    "key: value, other: 42, pattern: ^[a-z]+$",
]


def synthetic_corpus(lines: int, seed: int = 0) -> list[str]:
    """Pseudo-words and JSON punctuation: enough distinct pairs to train a large vocabulary."""
    import random

    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list('0123456789{}[]":,. ')

    def word() -> str:
        return "".join(rng.choice(syllables) for _ in range(rng.randint(1, 5)))

    return [" ".join(word() for _ in range(50)) for _ in range(lines)]


def train_tokenizer(vocab_size: int, corpus: list[str] | None = None):
    """A byte-level BPE tokenizer with <s>, </s> and <pad>, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or _CORPUS * 4, trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    out.chat_template = CHAT_TEMPLATE
    return out


# A ChatML-style template that starts with BOS, so a chat prompt encoded twice would show a double BOS.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def write_checkpoint(path: Path, cfg: ModelConfig, with_tokenizer: bool = True) -> Path:
    """Seeded random weights for `cfg`, saved in HF layout (unfused tensor names)."""
    path.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        tokenizer = train_tokenizer(cfg.vocab_size)
        # Special ids follow the trained vocabulary: <pad>=0, <s>=1, </s>=2.
        cfg = cfg.replace(bos_token_id=tokenizer.bos_token_id, eos_token_ids=(tokenizer.eos_token_id,))
        tokenizer.save_pretrained(path)
    model = build_model(cfg, None, torch.float32, torch.device("cpu"), max_positions=2)
    params = dict(model.named_parameters())
    tensors = {}
    # One rank's slices are whole tensors: each fused parameter splits back into its HF tensors.
    for ours, sl in param_slices(cfg, partition(cfg, 0, 1)).items():
        tensor = params[ours].detach()
        for piece in sl.pieces:
            tensors[piece.source] = tensor.narrow(sl.dim, piece.offset, piece.stop - piece.start).contiguous()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    return path
