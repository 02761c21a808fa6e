"""The engine side of guided decoding: matchers per request, and each step's token bitmask.

Capturable by design (as TensorRT-LLM's capturable guided decoder): a decode step copies the tokens
it feeds to pinned memory, a host callback advances each guided request's matcher with them and
fills the step's bitmask rows, and the mask is copied back and applied to the logits before
sampling. The callback takes no per-step arguments, so a CUDA graph can replay it: it reads the
step's row plan from a queue the host fills, in launch order, before each launch.

The callback is C++ (guided_fill.hpp) where the dispatch extension and xgrammar allow it: it never
takes the GIL, so it runs beside the engine's Python thread. Otherwise it is Python, with
xgrammar's calls holding the GIL (matcher_calls.py says why).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from .grammar_cache import GrammarCache
from .matcher_calls import MatcherCalls
from .native_fill import matcher_api, matcher_handle
from .spec import GuidedSpec

log = logging.getLogger("fastpath.guided")


class PythonRow:
    """A request's matcher driven from Python: the same interface as the extension's GuidedRow."""

    __slots__ = ("accepted", "calls", "error", "matcher", "terminated")

    def __init__(self, matcher: Any, calls: MatcherCalls) -> None:
        self.matcher, self.calls = matcher, calls
        self.accepted, self.error, self.terminated = 0, None, False

    @property
    def live(self) -> bool:
        return self.error is None and not self.terminated

    def accept(self, token: int) -> None:
        self.accepted += 1
        if not self.live:
            return
        if not self.calls.accept([self.matcher], [token])[0]:
            self.error = f"token {token} was sampled outside the grammar"
        else:
            self.terminated = self.calls.terminated(self.matcher)


@dataclass(slots=True)
class GuidedState:
    """A request's constraint, its matcher, and the row object that drives the matcher."""

    spec: GuidedSpec
    matcher: Any
    row: Any  # PythonRow, or the dispatch extension's GuidedRow
    warned: bool = False  # its row's error was logged

    @property
    def error(self) -> str | None:
        return self.row.error


class GuidedDecoder:
    @classmethod
    def for_engine(cls, config, extension: Any = None) -> GuidedDecoder | None:
        """The engine's guided decoder, or None when guided decoding is off."""
        if config.guided_backend == "none":
            return None
        if config.guided_backend != "xgrammar":
            raise ValueError(f"guided_backend: {config.guided_backend!r} is not supported (none, xgrammar)")
        if config.tensor_parallel_size > 1:
            raise ValueError("guided decoding with tensor_parallel_size > 1 is not supported yet")
        from ..tokenizer import resolve_tokenizer

        tokenizer = resolve_tokenizer(config.tokenizer, config.checkpoint, config.model.vocab_size)
        if tokenizer is None:
            raise ValueError("guided decoding needs the model's tokenizer, and this model has none")
        rows = max(config.max_batch_size, *config.graph_batch_sizes, 1)
        return cls(tokenizer, config.model.vocab_size, rows, config.device, extension=extension)

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        max_rows: int,
        device: torch.device,
        capacity: int = 64,
        extension: Any = None,
    ):
        self.cache = GrammarCache(tokenizer, vocab_size, capacity)
        self.vocab_size = vocab_size
        self.words = -(-vocab_size // 32)
        pinned = device.type == "cuda"
        self.host_tokens = torch.zeros(max_rows, dtype=torch.int64, pin_memory=pinned)
        self.host_mask = torch.full((max_rows, self.words), -1, dtype=torch.int32, pin_memory=pinned)
        self.host_rows = torch.zeros(max_rows, dtype=torch.int32, pin_memory=pinned)  # 1: row is constrained
        self.device_mask = torch.full((max_rows, self.words), -1, dtype=torch.int32, device=device)
        self.device_rows = torch.zeros(max_rows, dtype=torch.int32, device=device)
        cols = torch.arange(vocab_size, device=device)
        self._word = cols // 32
        self._bit = (cols % 32).to(torch.int32)
        self.calls = MatcherCalls()
        self._extension = extension
        self._api = matcher_api(extension) if extension is not None else None
        self.native = None
        if self._api is not None:
            self.native = extension.GuidedFill(
                self.host_tokens, self.host_mask, self.host_rows, max_rows, self.words
            )
        # The Python fill's state. Its callback touches these through numpy views: torch ops
        # release the GIL, and each release costs the callback a wait to get it back.
        self._queue: deque[list[Any]] = deque()
        self._tokens_np = self.host_tokens.numpy()
        self._mask_np = self.host_mask.numpy()
        self._rows_np = self.host_rows.numpy()
        self._fills = 0
        self._fill_seconds = 0.0

    @property
    def fill(self) -> str:
        """Where each step's fill runs: "native" (C++, no GIL) or "python"."""
        return "native" if self.native is not None else "python"

    @property
    def fills(self) -> int:
        return self.native.fills if self.native is not None else self._fills

    @property
    def fill_seconds(self) -> float:
        """Host time inside the fills, for bench/guided.py."""
        return self.native.step_seconds if self.native is not None else self._fill_seconds

    # --- requests ---------------------------------------------------------------------------------

    def state_for(self, spec: GuidedSpec) -> GuidedState:
        """A fresh matcher; raises GrammarError when the constraint does not compile."""
        matcher = self.cache.matcher(spec)
        if self.native is not None:
            return GuidedState(spec, matcher, self._extension.GuidedRow(self._api, matcher_handle(matcher)))
        return GuidedState(spec, matcher, PythonRow(matcher, self.calls))

    # --- each step ----------------------------------------------------------------------------------

    def enqueue(self, seqs: list[Any], rows_total: int) -> None:
        """The row plan of the next launched decode step: each row's matcher, None for a free row."""
        states = [None if s is None else s.guided for s in seqs]
        for state in states:
            if state is not None and state.row.error is not None and not state.warned:
                state.warned = True  # the row runs unconstrained from here
                log.warning("guided request: %s", state.row.error)
        plan = [None if s is None else s.row for s in states] + [None] * (rows_total - len(states))
        if self.native is not None:
            errors = self.native.take_errors()
            if errors:
                raise RuntimeError("guided fill failed: " + "; ".join(errors))
            self.native.enqueue(plan)
        else:
            self._queue.append(plan)

    def launch_fill(self, dispatcher: Any) -> None:
        """Enqueue this step's fill on the current stream (or into the graph being captured)."""
        if self.native is not None:
            dispatcher.launch_guided_fill(self.native)
        else:
            dispatcher.launch(self.fill_from_device_tokens)

    def fill_from_device_tokens(self) -> None:
        """The Python fill's callback: accept the fed tokens, then fill the next bitmask rows."""
        start = time.perf_counter()
        plan = self._queue.popleft()
        tokens = self._tokens_np.tolist()
        for r, row in enumerate(plan):
            if row is not None and row.live:
                row.accept(tokens[r])
        self._fill_python(plan)
        self._fill_seconds += time.perf_counter() - start

    def fill_on_host(self, seqs: list[Any]) -> None:
        """A prefill step's rows: every output so far is known on the host; accept what is new, then fill."""
        for seq in seqs:
            state = seq.guided
            if state is not None:
                for token in seq.output_ids[state.row.accepted :]:
                    state.row.accept(token)
        plan = [None if s.guided is None else s.guided.row for s in seqs]
        if self.native is not None:
            self.native.fill(plan)
        else:
            self._fill_python(plan)

    def _fill_python(self, plan: list[Any]) -> None:
        """Constrained rows filled row by row; the row flags say which rows are constrained."""
        flags, constrained = self._rows_np, []
        for r, row in enumerate(plan):
            live = row is not None and row.live
            flags[r] = live  # a free row's mask words are stale, and ignored
            if live:
                constrained.append(r)
        if constrained:
            self.calls.fill([plan[r].matcher for r in constrained], self._mask_np, constrained)
        self._fills += 1

    # --- on the device ------------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """logits with every token a constrained row's mask forbids set to -inf (pure tensor ops: capturable)."""
        n = logits.shape[0]
        forbidden = ((mask[:n, self._word] >> self._bit) & 1 == 0) & (rows[:n, None] != 0)
        return logits.masked_fill(forbidden, float("-inf"))
