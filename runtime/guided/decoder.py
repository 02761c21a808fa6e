"""The engine side of guided decoding: matchers per request, and each step's token bitmask.

Capturable by design (as TensorRT-LLM's capturable guided decoder): a decode step copies the tokens
it feeds to pinned memory, a host callback advances each guided request's matcher with them and
fills the step's bitmask rows, and the mask is copied back and applied to the logits before
sampling. The callback takes no per-step arguments, so a CUDA graph can replay it: it reads the
step's row assignment from a queue the host fills, in launch order, before each launch.
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
from .spec import GuidedSpec

log = logging.getLogger("fastpath.guided")


@dataclass(slots=True)
class GuidedState:
    """A request's matcher and how many of its output tokens the matcher has taken."""

    spec: GuidedSpec
    matcher: Any
    accepted: int = 0
    error: str | None = None
    terminated: bool = False

    @property
    def live(self) -> bool:
        """Still constrained: no error, and the matcher has not taken its stop token."""
        return self.error is None and not self.terminated


class GuidedDecoder:
    @classmethod
    def for_engine(cls, config) -> GuidedDecoder | None:
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
        return cls(tokenizer, config.model.vocab_size, rows, config.device)

    def __init__(
        self, tokenizer: Any, vocab_size: int, max_rows: int, device: torch.device, capacity: int = 64
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
        # The callback touches these through numpy views: torch ops release the GIL, and each
        # release costs the callback a wait for the engine's thread to give it back.
        self._tokens_np = self.host_tokens.numpy()
        self._mask_np = self.host_mask.numpy()
        self._rows_np = self.host_rows.numpy()
        cols = torch.arange(vocab_size, device=device)
        self._word = cols // 32
        self._bit = (cols % 32).to(torch.int32)
        self._queue: deque[list[Any]] = deque()
        self.calls = MatcherCalls()
        self.fills = 0
        self.fill_seconds = 0.0  # host time inside the fills, for bench/guided.py

    # --- requests ---------------------------------------------------------------------------------

    def state_for(self, spec: GuidedSpec) -> GuidedState:
        """A fresh matcher; raises GrammarError when the constraint does not compile."""
        return GuidedState(spec, self.cache.matcher(spec))

    # --- the host callback --------------------------------------------------------------------------

    def enqueue(self, rows: list[Any], rows_total: int) -> None:
        """The row assignment of the next launched decode step: a Sequence, or None for a free row."""
        self._queue.append(rows + [None] * (rows_total - len(rows)))

    def fill_from_device_tokens(self) -> None:
        """Host callback of a decode step: accept the fed tokens, then fill the next bitmask rows.

        Two xgrammar calls per step, both holding the GIL (matcher_calls.py says why).
        """
        start = time.perf_counter()
        rows = self._queue.popleft()
        tokens = self._tokens_np.tolist()
        states = [None if seq is None else seq.guided for seq in rows]
        live = [r for r, s in enumerate(states) if s is not None and s.live]
        self._accept([states[r] for r in live], [tokens[r] for r in live])
        self._fill_rows(states)
        self.fill_seconds += time.perf_counter() - start

    def fill_on_host(self, seqs: list[Any]) -> None:
        """A prefill step's rows: every output so far is known on the host; accept what is new, then fill."""
        for seq in seqs:
            state = seq.guided
            if state is not None:
                for token in seq.output_ids[state.accepted :]:
                    if state.live:
                        self._accept([state], [token])
                    else:
                        state.accepted += 1
        self._fill_rows([seq.guided for seq in seqs])

    def _accept(self, states: list[GuidedState], tokens: list[int]) -> None:
        if not states:
            return
        oks = self.calls.accept([s.matcher for s in states], tokens)
        for state, token, ok in zip(states, tokens, oks, strict=True):
            state.accepted += 1
            if not ok:
                state.error = f"token {token} was sampled outside the grammar"
                log.warning("guided request: %s", state.error)
            else:
                state.terminated = self.calls.terminated(state.matcher)

    def _fill_rows(self, states: list[GuidedState | None]) -> None:
        """Constrained rows through xgrammar's batch fill (its own threads); the row flags say which."""
        flags, constrained = self._rows_np, []
        for r, s in enumerate(states):
            live = s is not None and s.live
            flags[r] = live  # a free row's mask words are stale, and ignored
            if live:
                constrained.append(r)
        if constrained:
            self.calls.fill([states[r].matcher for r in constrained], self._mask_np, constrained)
        self.fills += 1

    # --- on the device ------------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """logits with every token a constrained row's mask forbids set to -inf (pure tensor ops: capturable)."""
        n = logits.shape[0]
        forbidden = ((mask[:n, self._word] >> self._bit) & 1 == 0) & (rows[:n, None] != 0)
        return logits.masked_fill(forbidden, float("-inf"))
