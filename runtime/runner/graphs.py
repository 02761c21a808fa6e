"""Decode as CUDA graphs: one per (batch bucket, sampling kind), replayed from static buffers."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..progress import progress
from .decode_inputs import DecodeBuffers
from .sampler import Sampled, SamplingTensors

if TYPE_CHECKING:
    from .runner import ModelRunner

log = logging.getLogger("fastpath.graphs")

KINDS = ("greedy", "general")  # greedy graphs skip the sort and noise of random sampling
GUIDED_KINDS = ("guided_greedy", "guided_general")  # the same two, with the grammar's bitmask applied
LORA = "lora_"  # prefixes a kind whose steps run LoRA deltas (some row has an adapter)


@dataclass(slots=True)
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    out: Sampled


def capture_graph(
    core: ModelRunner, pool, run: Callable[[], Sampled], warm: Callable[[], None] = lambda: None
) -> CapturedGraph:
    """`run` captured in a CUDA graph from `pool` (None: a new one): the graph and what it returns.

    Two warm runs go first on a side stream, so lazy inits (cuBLAS workspaces, Triton compiles and
    autotuning) stay out of the capture; `warm` runs before each. The dispatcher counts the graph's
    host callbacks, so each replay can announce them.
    """
    side = torch.cuda.Stream(core.device)
    side.wait_stream(torch.cuda.current_stream(core.device))
    with torch.cuda.stream(side):
        for _ in range(2):
            warm()
            run()
    torch.cuda.current_stream(core.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with no_collection(), core.dispatcher.graph(graph, pool=pool):
        out = run()
    return CapturedGraph(graph, out)


@contextmanager
def no_collection() -> Iterator[None]:
    """Python's cyclic collector paused while a graph is captured. A collection runs finalizers, and
    one that frees a CUDA resource (pinned memory, an event, a dead graph) invalidates the capture,
    which then fails at some later launch. (No collection first: a full one per graph is what made
    torch stop collecting before captures.)"""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class DecodeGraphs:
    def __init__(self, core: ModelRunner, batch_sizes: tuple[int, ...]) -> None:
        self.core = core
        self.sizes = tuple(sorted(batch_sizes))
        hidden = core.model.cfg.hidden_size if core.decode_from_embeds else None
        self.buffers = {
            b: DecodeBuffers.allocate(b, core.table_width, hidden, core.dtype, core.device)
            for b in self.sizes
        }
        self.sampling = {b: SamplingTensors.empty(b, core.device) for b in self.sizes}
        self.graphs: dict[tuple[int, str], CapturedGraph] = {}
        self._pool = None

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.sizes if b >= n), None)

    def capture_all(self) -> None:
        # Largest first, so smaller graphs fit in the memory pool the largest one set aside.
        kinds = KINDS + (GUIDED_KINDS if self.core.guided is not None else ())
        if self.core.model.lora is not None:  # steps with an adapter row, and the base steps apart
            kinds += tuple(LORA + k for k in kinds)
        work = [(b, kind) for b in reversed(self.sizes) for kind in kinds]
        for b, kind in progress(work, "capturing CUDA graphs"):
            self.capture(b, kind)
        log.info("captured %d decode graphs for batch sizes %s", len(self.graphs), list(self.sizes))

    def capture(self, rows: int, kind: str) -> None:
        core, bufs = self.core, self.buffers[rows]
        sampling = None if kind.endswith("greedy") else self.sampling[rows]
        lora = kind.startswith(LORA)
        guided = kind.removeprefix(LORA) in GUIDED_KINDS
        warm = (lambda: core.guided.enqueue([], rows)) if guided else (lambda: None)  # fills free rows only
        if core.model.lora is not None:  # the graph records the path the flag picks at capture
            core.model.lora.active = lora
        try:
            captured = capture_graph(
                core,
                self._pool,
                lambda: core.decode_forward(bufs, sampling, capturing=True, guided=guided),
                warm,
            )
        finally:
            if core.model.lora is not None:
                core.model.lora.active = False
        self._pool = captured.graph.pool()
        self.graphs[(rows, kind)] = captured

    def replay(self, rows: int, kind: str) -> Sampled:
        g = self.graphs[(rows, kind)]
        self.core.dispatcher.replay(g.graph)
        return g.out
