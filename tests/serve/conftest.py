import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("FASTPATH_PROGRESS", "0")

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from serve_helpers import engine


@pytest.fixture(scope="session")
def tiny_text_checkpoint(tmp_path_factory) -> Path:
    from fastpath.runtime.model.presets import resolve_random
    from fastpath.runtime.model.tiny_checkpoint import write_checkpoint

    return write_checkpoint(
        tmp_path_factory.mktemp("text") / "tiny-llama", resolve_random("random:tiny-llama", 0)
    )


@pytest.fixture(scope="session")
def llm(tiny_text_checkpoint):
    """One engine for the in-process servers: every test's requests share its batch, as clients would."""
    with engine(tiny_text_checkpoint) as llm:
        yield llm
