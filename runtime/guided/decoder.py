"""The engine side of guided decoding: matchers per request, and each step's token bitmask.

Capturable by design (as TensorRT-LLM's capturable guided decoder): a decode step copies the tokens
it feeds to pinned memory, a host callback advances each guided request's matcher with them and
fills the step's bitmask rows, and the mask is copied back and applied to the logits before
sampling. The callback takes no per-step arguments, so a CUDA graph can replay it: it reads the
step's row plan from a queue the host fills, in launch order, before each launch.

The callback is C++ (guided_fill.hpp) where the dispatch extension and xgrammar allow it: it never
takes the GIL, so it runs beside the engine's Python thread. Otherwise it is Python: with xgrammar,
its calls hold the GIL (matcher_calls.py says why); with llguidance, one parallel call per step
fills every row off the GIL (llguidance_backend.py). The C++ fill spreads a step's rows over
threads (FASTPATH_GUIDED_FILL_THREADS; by default half the usable CPUs, at most 8): one row can cost
200 times another, and the fill is hidden only while it is shorter than the forward beside it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from .backends import check_name, make_backend, resolve_backend
from .grammar_cache import GrammarCache
from .matcher_calls import usable_cpus
from .native_fill import matcher_api, matcher_handle
from .python_fill import PythonFill, PythonRow
from .spec import GuidedSpec, parse_spec

log = logging.getLogger("fastpath.guided")

FILL_THREADS_ENV = "FASTPATH_GUIDED_FILL_THREADS"


def fill_threads() -> int:
    """The C++ fill's thread count: FASTPATH_GUIDED_FILL_THREADS (1 to 64), else half the CPUs this
    process may use, at most 8. On the H200's 16-CPU host a batch-16 guided step's fill took a mean
    554 µs on one thread and 208 on eight (docs/performance.md, round 18)."""
    raw = os.environ.get(FILL_THREADS_ENV)
    if raw is None:
        return min(8, max(1, usable_cpus() // 2))
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if not 1 <= threads <= 64:
        raise ValueError(f"{FILL_THREADS_ENV}={raw!r}: give a thread count from 1 to 64")
    return threads


@dataclass(slots=True)
class GuidedState:
    """A request's constraint, its matcher, and the row object that drives the matcher."""

    spec: GuidedSpec
    matcher: Any
    row: Any  # python_fill.PythonRow, or the dispatch extension's GuidedRow
    warned: bool = False  # its row's error was logged

    @property
    def error(self) -> str | None:
        return self.row.error


class GuidedDecoder:
    @classmethod
    def for_engine(cls, config, extension: Any = None) -> GuidedDecoder | None:
        """The engine's guided decoder, or None when guided decoding is off.

        The engine resolves "auto" first (backends.resolve_backend); "auto" still works here, so an
        engine that passes it through gets the same choice.
        """
        name = check_name(config.guided_backend)
        if name == "none":
            return None
        from ..model.tokenizer import resolve_tokenizer

        tokenizer = resolve_tokenizer(config.tokenizer, config.checkpoint, config.model.vocab_size)
        name, _ = resolve_backend(
            name, has_tokenizer=tokenizer is not None, tensor_parallel_size=config.tensor_parallel_size
        )
        if name == "none":
            return None
        rows = max(config.max_batch_size, *config.graph_batch_sizes, 1)
        backend = make_backend(name, tokenizer, config.model.vocab_size)
        return cls(backend, rows, config.device, extension=extension)

    def __init__(
        self,
        backend: Any,  # backends.make_backend's: XGrammarBackend or LLGuidanceBackend
        max_rows: int,
        device: torch.device,
        capacity: int = 64,
        extension: Any = None,
    ):
        self.backend = backend
        self.cache = GrammarCache(backend, capacity)
        self.vocab_size = vocab_size = backend.vocab_size
        self.words = -(-vocab_size // 32)
        pinned = device.type == "cuda"
        self.host_tokens = torch.zeros(max_rows, dtype=torch.int64, pin_memory=pinned)
        self.host_mask = torch.full((max_rows, self.words), -1, dtype=torch.int32, pin_memory=pinned)
        self.host_rows = torch.zeros(max_rows, dtype=torch.int32, pin_memory=pinned)  # 1: row is constrained
        self.device_mask = torch.full((max_rows, self.words), -1, dtype=torch.int32, device=device)
        self.device_rows = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.calls = backend.calls
        self.broken: list[Any] = []  # sequences whose row left its grammar: the engine ends each
        self._extension = extension
        # The C++ fill calls xgrammar's matchers through tvm-ffi; any other backend fills from Python.
        native = extension is not None and backend.name == "xgrammar"
        self._api = matcher_api(extension) if native else None
        if self._api is not None:
            args = (self.host_tokens, self.host_mask, self.host_rows, max_rows, self.words)
            threads = fill_threads()
            # An extension built before the pool existed takes no thread count: it fills on one thread.
            self.filler = (
                extension.GuidedFill(*args, threads=threads) if threads > 1 else extension.GuidedFill(*args)
            )
        else:
            self.filler = PythonFill(self.host_tokens, self.host_mask, self.host_rows, self.calls)

    @property
    def fill(self) -> str:
        """Where each step's fill runs: "native" (C++, no GIL) or "python"."""
        return "native" if self._api is not None else "python"

    @property
    def fill_threads(self) -> int:
        """Threads a native fill spreads a step's rows over (FASTPATH_GUIDED_FILL_THREADS)."""
        return getattr(self.filler, "threads", 1) if self._api is not None else 1

    # --- requests ---------------------------------------------------------------------------------

    def state_for(self, spec: GuidedSpec | Any, gate: int | None = None) -> GuidedState:
        """A fresh matcher for a GuidedSpec or a request's raw constraint dict; with `gate` (a reasoning
        model's end-of-thinking token) the grammar holds the request only after the model writes it.

        Raises ValueError for a malformed constraint and GrammarError (a ValueError) for one that
        does not compile: either is the request's own error.
        """
        spec = parse_spec(spec)
        own = self.backend.name
        if spec.backend not in ("auto", own):
            # One backend per engine: each step's fill drives one kind of matcher (the C++ fill, xgrammar's).
            raise ValueError(
                f"guided: backend {spec.backend!r} is not available in this engine, which guides with {own} "
                f"(available: 'auto', {own!r}); build the LLM with guided_backend={spec.backend!r} for it"
            )
        matcher = self.cache.matcher(spec)
        gate = -1 if gate is None else gate
        if self._api is not None:
            if gate >= 0 and not hasattr(self._extension.GuidedRow, "open"):
                raise ValueError(
                    "guided: after_reasoning needs this package's extension rebuilt with this fastpath"
                )
            handle = matcher_handle(matcher)
            row = (
                self._extension.GuidedRow(self._api, handle, gate)
                if gate >= 0
                else self._extension.GuidedRow(self._api, handle)
            )
            return GuidedState(spec, matcher, row)
        return GuidedState(spec, matcher, PythonRow(matcher, self.calls, gate))

    # --- each step ----------------------------------------------------------------------------------

    def enqueue(self, seqs: list[Any], rows_total: int) -> None:
        """The row plan of the next launched decode step: each row's matcher, None for a free row."""
        states = [None if s is None else s.guided for s in seqs]
        for seq, state in zip(seqs, states, strict=True):
            if state is not None and state.row.error is not None and not state.warned:
                state.warned = True  # unconstrained until the engine ends it (take_broken)
                log.warning("guided request: %s", state.row.error)
                self.broken.append(seq)
        errors = self.filler.take_errors()
        if errors:
            raise RuntimeError("guided fill failed: " + "; ".join(errors))
        self.filler.enqueue(
            [None if s is None else s.row for s in states] + [None] * (rows_total - len(states))
        )

    def take_broken(self) -> list[Any]:
        """The sequences whose sampled token their grammar refused since the last call: a grammar and
        the request's own bans (allowed_token_ids, bad_words, logit_bias) that left no token both allow."""
        broken, self.broken = self.broken, []
        return broken

    def launch_fill(self, dispatcher: Any) -> None:
        """Enqueue this step's fill on the current stream (or into the graph being captured)."""
        if self._api is not None:
            dispatcher.launch_guided_fill(self.filler)  # a C++ callback
        else:
            dispatcher.launch(self.filler.run_step)

    def fill_on_host(self, seqs: list[Any]) -> None:
        """A prefill step's rows: every output so far is known on the host; accept what is new, then fill."""
        for seq in seqs:
            state = seq.guided
            if state is not None:
                for token in seq.output_ids[state.row.accepted :]:
                    state.row.accept(token)
        self.filler.fill([None if s.guided is None else s.guided.row for s in seqs])
