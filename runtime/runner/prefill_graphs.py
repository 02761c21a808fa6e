"""Prefill as CUDA graphs: one per (padded token count, sampling kind), replayed from static buffers.

An eager prefill step launches about fifteen kernels per layer from Python: on the H200 a step of
about 1000 tokens took twice its GPU time, and while it ran, every decoding sequence of a mixed
batch waited. Captured at a few token counts, a step is two copies and one replay.

Only a prefill attention that takes every sequence in one launch can be captured (triton_prefill):
its tile table becomes a static buffer here. Padding is inert: padding tokens write the null
block's slot 0 and sample nothing, and padding tiles point at an extra sequence of length 0, so
their programs read no key. Steps that do not fit (more tokens than the largest bucket, a table
wider than the engine's, guided rows) run eagerly, as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..attention.metadata import AttentionMetadata
from ..attention.triton_prefill import BLOCK_M, tile_map
from ..progress import progress
from .graphs import CapturedGraph, capture_graph
from .sampler import Sampled, SamplingTensors, sample
from .step_inputs import PrefillStep

if TYPE_CHECKING:
    from .runner import ModelRunner

log = logging.getLogger("fastpath.graphs")

# Padding is compute: a served step of ~560 tokens padded to 768 cost a third more than its tokens.
# Steps of 64 tokens (BLOCK_M) to 512, then 128, 256 and 512: a step pads by at most 64 tokens, or
# a quarter of its own, whichever is more.
TOKEN_BUCKETS = (
    *range(128, 512, 64), *range(512, 1024, 128), *range(1024, 2048, 256), *range(2048, 4097, 512),
)  # fmt: skip
KINDS = ("greedy", "general")


def token_buckets(max_num_batched_tokens: int) -> tuple[int, ...]:
    """The padded token counts captured: TOKEN_BUCKETS up to the step budget, and the budget itself
    when it is smaller than the largest (a step never holds more)."""
    top = min(max_num_batched_tokens, TOKEN_BUCKETS[-1])
    return (*(t for t in TOKEN_BUCKETS if t < top), top)


@dataclass(slots=True)
class PrefillLayout:
    """Where a bucket's inputs sit in its two flat buffers (host staging and device alike)."""

    tokens: int  # T
    seqs: int  # S; the padding sequence is row S of `tables` and `ends`
    width: int  # W, blocks per table row

    @property
    def tiles(self) -> int:
        # A sequence of q queries takes ceil(q / BLOCK_M) tiles: at most T / BLOCK_M + S in all.
        return self.tokens // BLOCK_M + self.seqs

    @property
    def words64(self) -> int:  # ids, positions, slots [T]; logits rows [S]
        return 3 * self.tokens + self.seqs

    @property
    def words32(self) -> int:  # tables [S + 1, W]; ends [S + 1]; tiles [tiles, 4]
        return (self.seqs + 1) * (self.width + 1) + 4 * self.tiles

    def views64(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t, s = self.tokens, self.seqs
        return flat[:t], flat[t : 2 * t], flat[2 * t : 3 * t], flat[3 * t : 3 * t + s]

    def views32(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s1, w = self.seqs + 1, self.width
        tables = flat[: s1 * w].view(s1, w)
        ends = flat[s1 * w : s1 * (w + 1)]
        tiles = flat[s1 * (w + 1) :]
        return tables, ends, tiles

    def fits(self, step: PrefillStep) -> bool:
        return (
            step.ids.shape[0] <= self.tokens
            and step.tables.shape[0] <= self.seqs
            and step.tables.shape[1] <= self.width
            and step.logits_rows.shape[0] <= self.seqs
        )

    def stage(self, step: PrefillStep, host64: torch.Tensor, host32: torch.Tensor) -> None:
        """Write `step` into host staging buffers laid out for this bucket, padding included."""
        n, s, r = step.ids.shape[0], step.tables.shape[0], step.logits_rows.shape[0]
        ids, positions, slots, rows = (v.numpy() for v in self.views64(host64))
        ids[:n], positions[:n], slots[:n], rows[:r] = step.ids, step.positions, step.slots, step.logits_rows
        ids[n:], positions[n:], slots[n:], rows[r:] = 0, 0, 0, 0
        tables, ends, tiles = (v.numpy() for v in self.views32(host32))
        # Rows past the step's keep stale entries: no tile names them. Row S is the empty sequence.
        tables[:s, : step.tables.shape[1]] = step.tables
        ends[:s], ends[s:] = step.ends, 0
        live = np.asarray(tile_map(step.query_lens.tolist(), BLOCK_M), dtype=np.int32)
        tiles[: live.size] = live
        tiles[live.size :].reshape(-1, 4)[:] = (self.seqs, 0, 0, 0)


@dataclass(slots=True)
class PrefillBuffers:
    layout: PrefillLayout
    flat64: torch.Tensor
    flat32: torch.Tensor
    host64: torch.Tensor  # pinned staging, one per bucket: a replay's two copies read them
    host32: torch.Tensor
    sampling: SamplingTensors  # [S]
    neutral: SamplingTensors  # [S] greedy rows with no penalty slot: the general graph's padding

    @classmethod
    def allocate(cls, layout: PrefillLayout, device: torch.device) -> PrefillBuffers:
        def pair(words: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
            return (
                torch.zeros(words, dtype=dtype, device=device),
                torch.zeros(words, dtype=dtype, pin_memory=True),
            )

        flat64, host64 = pair(layout.words64, torch.int64)
        flat32, host32 = pair(layout.words32, torch.int32)
        sampling = SamplingTensors.neutral(layout.seqs, device)
        return cls(
            layout, flat64, flat32, host64, host32, sampling, SamplingTensors.neutral(layout.seqs, device)
        )

    def load(self, step: PrefillStep) -> None:
        self.layout.stage(step, self.host64, self.host32)
        self.flat64.copy_(self.host64, non_blocking=True)
        self.flat32.copy_(self.host32, non_blocking=True)
        if step.sampling is not None:
            r = step.logits_rows.shape[0]
            self.sampling.data[:r].copy_(step.sampling.data, non_blocking=True)
            self.sampling.data[r:].copy_(self.neutral.data[r:])


class PrefillGraphs:
    def __init__(self, core: ModelRunner, token_sizes: tuple[int, ...], max_seqs: int) -> None:
        self.core = core
        self.sizes = tuple(sorted(token_sizes))
        self.buffers = {
            t: PrefillBuffers.allocate(PrefillLayout(t, max_seqs, core.table_width), core.device)
            for t in self.sizes
        }
        self.graphs: dict[tuple[int, str], CapturedGraph] = {}
        self._pool = None
        self.replays = 0  # steps run from a graph, for tests and the bench

    def bucket(self, step: PrefillStep) -> int | None:
        """The token bucket whose graph runs `step`; None when none can."""
        n = step.ids.shape[0]
        t = next((t for t in self.sizes if t >= n), None)
        return t if t is not None and self.buffers[t].layout.fits(step) else None

    def forward(self, bufs: PrefillBuffers, kind: str) -> Sampled:
        """The pure prefill step over a bucket's static buffers (captured, never run eagerly)."""
        core, layout = self.core, bufs.layout
        ids, positions, slots, rows = layout.views64(bufs.flat64)
        tables, ends, tiles = layout.views32(bufs.flat32)
        meta = AttentionMetadata(
            "prefill",
            slots,
            tables,
            ends,
            block_size=core.block_size,
            sliding_window=core.model.cfg.sliding_window,
            capturing=True,
        )
        meta._tables[("prefill_tiles", BLOCK_M)] = tiles
        logits = core.model(core.model.embed(ids), positions, core.kv, meta, core.fmha, rows)
        sampling = None if kind == "greedy" else bufs.sampling
        return sample(logits, sampling, core.model.ops, core.penalties, top=sampling is not None)

    def capture_all(self) -> None:
        # Largest first, so smaller graphs fit in the memory pool the largest one set aside.
        work = [(t, kind) for t in reversed(self.sizes) for kind in KINDS]
        for t, kind in progress(work, "capturing prefill graphs"):
            self.capture(t, kind)
        log.info("captured %d prefill graphs for token counts %s", len(self.graphs), list(self.sizes))

    def capture(self, tokens: int, kind: str) -> None:
        captured = capture_graph(self.core, self._pool, lambda: self.forward(self.buffers[tokens], kind))
        self._pool = captured.graph.pool()
        self.graphs[(tokens, kind)] = captured

    def run(self, tokens: int, step: PrefillStep, prev: torch.Tensor | None = None) -> Sampled:
        """Load `step` into its bucket's buffers and replay; the sampled rows, padding included.
        `prev`: the device tokens of the step in flight, which `step.pending` takes ids from.

        The host staging buffers are rewritten with no wait: the engine completes (reads back) a
        prefill step before it schedules the next one, so their last copy has run."""
        bufs = self.buffers[tokens]
        bufs.load(step)
        self.core.take_pending(bufs.layout.views64(bufs.flat64)[0], step.pending, prev)
        g = self.graphs[(tokens, "greedy" if step.sampling is None else "general")]
        self.core.dispatcher.replay(g.graph)
        self.replays += 1
        return g.out
