"""Reference decode_prologue hooks.

`FusedDecodePrologue` does a decode step's whole input prologue in one Triton launch: token ids
(taken from the previous step's device tokens where the host does not know them yet), positions,
slot mapping, context lengths, block-table rows, and the embedding lookup. On CPU it declines.
Under tensor parallelism the lookup is this rank's share (zeros for ids outside its vocabulary
slice); the forward sums the shares.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from .runner.decode_inputs import DecodeInputs, unpack_in_one_launch

if TYPE_CHECKING:
    from .engine.executor import ExecutorCore


class FusedDecodePrologue:
    """decode_prologue hook: one launch on CUDA; declines elsewhere so the native prologue runs."""

    def __init__(self) -> None:
        self.available = importlib.util.find_spec("triton") is not None

    def __call__(self, executor: ExecutorCore, inputs: DecodeInputs) -> bool:
        b = inputs.buffers
        if not (self.available and executor.is_cuda and b.embeds is not None):
            return False
        packed = inputs.packed.to(executor.device, non_blocking=True)
        unpack_in_one_launch(inputs, packed, executor.model.embed_tokens)
        return True
