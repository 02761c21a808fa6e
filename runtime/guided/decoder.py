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

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import torch

from .grammar_cache import GrammarCache
from .matcher_calls import MatcherCalls
from .native_fill import matcher_api, matcher_handle
from .python_fill import PythonFill, PythonRow
from .spec import GuidedSpec

log = logging.getLogger("fastpath.guided")


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
        """The engine's guided decoder, or None when guided decoding is off."""
        if config.guided_backend == "none":
            return None
        if config.guided_backend != "xgrammar":
            raise ValueError(f"guided_backend: {config.guided_backend!r} is not supported (none, xgrammar)")
        if config.tensor_parallel_size > 1:
            raise ValueError("guided decoding with tensor_parallel_size > 1 is not supported yet")
        if importlib.util.find_spec("xgrammar") is None:
            raise ModuleNotFoundError(
                "guided_backend 'xgrammar' needs the xgrammar package: pip install 'fastpath-llm[guided]'",
                name="xgrammar",
            )
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
        if self._api is not None:
            self.filler = extension.GuidedFill(
                self.host_tokens, self.host_mask, self.host_rows, max_rows, self.words
            )
        else:
            self.filler = PythonFill(self.host_tokens, self.host_mask, self.host_rows, self.calls)

    @property
    def fill(self) -> str:
        """Where each step's fill runs: "native" (C++, no GIL) or "python"."""
        return "native" if self._api is not None else "python"

    @property
    def fills(self) -> int:
        return self.filler.fills

    @property
    def fill_seconds(self) -> float:
        """Host time inside the fills' callbacks, for bench/guided.py."""
        return self.filler.step_seconds

    # --- requests ---------------------------------------------------------------------------------

    def state_for(self, spec: GuidedSpec) -> GuidedState:
        """A fresh matcher; raises GrammarError when the constraint does not compile."""
        matcher = self.cache.matcher(spec)
        if self._api is not None:
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
        errors = self.filler.take_errors()
        if errors:
            raise RuntimeError("guided fill failed: " + "; ".join(errors))
        self.filler.enqueue(
            [None if s is None else s.row for s in states] + [None] * (rows_total - len(states))
        )

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

    # --- on the device ------------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """logits with every token a constrained row's mask forbids set to -inf (pure tensor ops: capturable)."""
        n = logits.shape[0]
        forbidden = ((mask[:n, self._word] >> self._bit) & 1 == 0) & (rows[:n, None] != 0)
        return logits.masked_fill(forbidden, float("-inf"))
