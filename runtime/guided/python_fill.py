"""The guided fill in Python: llguidance's, and the fallback for an xgrammar not built on tvm-ffi.

`PythonFill` and `PythonRow` have the interface of the dispatch extension's `GuidedFill` and
`GuidedRow` (cpp/include/fastpath/guided_fill.hpp), so the decoder drives either. The callback
touches the pinned buffers through numpy views: torch ops release the GIL, and each release costs
the callback a wait to get it back (matcher_calls.py says why that wait is long).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch


class PythonRow:
    """A request's matcher driven from Python."""

    __slots__ = ("accepted", "calls", "error", "gate", "matcher", "open", "terminated")

    def __init__(self, matcher: Any, calls: Any, gate: int = -1) -> None:  # MatcherCalls or LLGuidanceCalls
        self.matcher, self.calls = matcher, calls
        self.accepted, self.error, self.terminated = 0, None, False
        # gate >= 0: a reasoning model's end-of-thinking token; the grammar holds the row from the token
        # after it (GuidedRow in guided_fill.hpp says the same).
        self.gate, self.open = gate, gate < 0

    @property
    def live(self) -> bool:
        return self.error is None and not self.terminated

    def accept(self, token: int) -> None:
        self.accepted += 1
        if not self.open:  # still thinking: the gate token opens the grammar and is not its input
            self.open = token == self.gate
            return
        if not self.live:
            return
        if not self.calls.accept(self.matcher, token):
            self.error = f"token {token} was sampled outside the grammar"
        else:
            self.terminated = self.calls.terminated(self.matcher, token)


class PythonFill:
    """Each decode step's bitmask, filled by a Python host callback from a queue of row plans."""

    def __init__(self, tokens: torch.Tensor, mask: torch.Tensor, flags: torch.Tensor, calls: Any) -> None:
        self.calls = calls
        self._tokens, self._mask, self._flags = tokens.numpy(), mask.numpy(), flags.numpy()
        self._plans: deque[list[Any]] = deque()
        self.fills = 0
        self.steps = 0  # run_step calls
        self.step_seconds = 0.0  # inside run_step
        self._durations: deque[float] = deque(maxlen=4096)  # µs, the last run_step calls'

    def enqueue(self, plan: list[Any]) -> None:
        self._plans.append(plan)

    def take_errors(self) -> list[str]:
        return []  # a failing callback raises, and the dispatcher re-raises it at check()

    def run_step(self) -> None:
        """The callback: the step's fed tokens into its guided rows, then their bitmask rows."""
        start = time.perf_counter()
        plan = self._plans.popleft()
        tokens = self._tokens.tolist()
        for r, row in enumerate(plan):
            if row is not None and row.live:
                row.accept(tokens[r])
        self.fill(plan)
        took = time.perf_counter() - start
        self.step_seconds += took
        self.steps += 1
        self._durations.append(took * 1e6)

    def step_durations_us(self) -> list[float]:
        """How long each of the last 4096 decode steps' fills took, oldest first."""
        return list(self._durations)

    def fill(self, plan: list[Any]) -> None:
        """Row r constrained <=> flags[r] == 1; a free row's mask words are stale and ignored."""
        constrained = []
        for r, row in enumerate(plan):
            live = row is not None and row.live and row.open
            self._flags[r] = live
            if live:
                constrained.append(r)
        if constrained:
            self.calls.fill([plan[r].matcher for r in constrained], self._mask, constrained)
        self.fills += 1
