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
