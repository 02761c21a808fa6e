import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("FASTPATH_PROGRESS", "0")

from checkpoints import ARCHS, build_checkpoint


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {arch: build_checkpoint(root, arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_text_checkpoint(tmp_path_factory) -> Path:
    from fastpath.runtime.model.presets import resolve_random
    from fastpath.runtime.model.tiny_checkpoint import write_checkpoint

    return write_checkpoint(
        tmp_path_factory.mktemp("text") / "tiny-llama", resolve_random("random:tiny-llama", 0)
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_text_checkpoint):
    from fastpath.runtime.model.tokenizer import load_tokenizer

    return load_tokenizer(tiny_text_checkpoint)


@pytest.fixture(scope="module")
def decoders(tokenizer):
    """One guided decoder per backend name, built as the engine builds it on a CPU device."""
    import torch
    from guided_cases import VOCAB

    from fastpath.runtime.guided.backends import make_backend
    from fastpath.runtime.guided.decoder import GuidedDecoder

    made = {}

    def get(name):
        if name not in made:
            made[name] = GuidedDecoder(make_backend(name, tokenizer, VOCAB), 4, torch.device("cpu"))
        return made[name]

    return get
