"""One request's state as the scheduler and executor see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    eos_ids: frozenset[int]
    max_seq_len: int
    index: int = 0  # the request's position in its generate() call
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    table_epoch: int = 0  # bumped when the table is released: cached copies of it are stale
    num_computed: int = 0  # tokens whose KV is in the cache (or being written by a launched step)
    num_pending: int = 0  # sampled on the device, not yet read back (the overlap loop's lag)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    error: str | None = None
    guided: Any = None  # the guided-decoding matcher, when the request has a constraint

    @property
    def max_new_tokens(self) -> int:
        return self.params.max_tokens if self.params.max_tokens is not None else self.max_seq_len

    @property
    def num_known(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_known + self.num_pending

    @property
    def num_generated(self) -> int:
        return len(self.output_ids) + self.num_pending

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def token_at(self, i: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    def can_generate_more(self) -> bool:
        return self.num_generated < self.max_new_tokens and self.num_tokens < self.max_seq_len

    def accept(self, token: int, logprob: float | None) -> None:
        """Record one read-back token and decide whether the request is done."""
        self.num_pending -= 1
        self.output_ids.append(token)
        if logprob is not None:
            self.logprobs.append(logprob)
        if token in self.params.stop_token_ids or (token in self.eos_ids and not self.params.ignore_eos):
            self.finish_reason = "stop"
        elif len(self.output_ids) >= self.max_new_tokens or self.num_known >= self.max_seq_len:
            self.finish_reason = "length"
