"""A decode batch's sampling rows, kept from one step to the next.

Packing every row's parameters cost the host a Python pass over the batch each step, and pinning
the result another copy. A steady batch (the same sequences in the same rows, no penalty slot
handed out or taken back since) changes only its counters, so its rows are kept as an array and
only that column is written, into one of two pinned buffers in turn (alternating.py).
"""

from __future__ import annotations

import numpy as np
import torch

from ..runner.penalties import PenaltySlots
from ..runner.sampler import FIELDS, SamplingTensors
from .alternating import Alternating
from .sequence import Sequence
from .steps import sampling_tensors

COUNTERS = FIELDS.index("counters")


class SamplingRows:
    def __init__(self, pinned: bool) -> None:
        self._seqs: list[Sequence] = []  # holds them: their ids stay theirs while cached
        self._key: tuple[int, int] | None = None  # (rows, penalty slots' version)
        self._rows = np.zeros((0, len(FIELDS)), dtype=np.int64)
        self._buffers = Alternating(
            lambda rows: torch.zeros(rows, len(FIELDS), dtype=torch.int64, pin_memory=pinned)
        )

    def tensors(self, seqs: list[Sequence], rows: int, slots: PenaltySlots | None) -> SamplingTensors:
        key = (rows, slots.version if slots is not None else 0)
        if key != self._key or seqs != self._seqs:  # list ==: identity first, so a steady batch is cheap
            self._rows = sampling_tensors(seqs, rows, slots).data.numpy().copy()
            self._seqs, self._key = list(seqs), key
        else:
            self._rows[: len(seqs), COUNTERS] = [len(s.output_ids) + s.num_pending for s in seqs]
        out = self._buffers.next(rows)
        out.numpy()[:] = self._rows
        return SamplingTensors(out)
