"""Per-request generation settings, validated up front so a bad request fails alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    seed: int | None = None  # None: derived from the engine seed and the request's index
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    guided: dict[str, Any] | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    def problems(self) -> list[str]:
        out = []
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            out.append(f"max_tokens must be a positive int, got {self.max_tokens!r}")
        if not (
            isinstance(self.temperature, (int, float))
            and math.isfinite(self.temperature)
            and self.temperature >= 0
        ):
            out.append(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            out.append(f"top_k must be an int >= 0, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            out.append(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            out.append(f"seed must be an int >= 0, got {self.seed!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            out.append(f"stop_token_ids must be ints >= 0, got {self.stop_token_ids!r}")
        return out

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
