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
    index: int = 0  # which of its request's n completions this is
    # The tokenizer's own EOS, which stops with no stop_reason ahead of stop_token_ids; the model's
    # other EOS ids (generation_config's) stop after them, with their id, as vLLM makes them stop
    # tokens. None: every EOS id stops with none.
    primary_eos: int | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # of each chosen token, when the request asks
    ranks: list[int] = field(default_factory=list)  # of each chosen token among the raw logits, likewise
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)  # when it asks for top-k
    block_table: list[int] = field(default_factory=list)
    table_epoch: int = 0  # bumped when the table is released: cached copies of it are stale
    num_computed: int = 0  # tokens whose KV is in the cache (or being written by a launched step)
    num_pending: int = 0  # sampled on the device, not yet read back (the overlap loop's lag)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token id (or, set by its request, stop string)
    error: str | None = None
    guided: Any = None  # the guided-decoding matcher, when the request has a constraint
    biases: Any = None  # its token_biases.TokenBiases (logit_bias, allowed_token_ids, bad_words), if any
    sink: Any = None  # what hears of its tokens (engine/request.py); None for internal probes
    streams: bool = False  # report every step's tokens, not only the finish
    penalty_slot: int = 0  # its row in the sampler's penalty tables (0: none)
    lora: Any = None  # its LoRARequest (engine/lora_request.py), if it runs with an adapter
    lora_slot: int = -1  # the device slot holding that adapter while it runs (engine/lora_slots.py)
    # Prefix caching (runner/prefix_cache.py): tokens its last admission found cached, and how far
    # its blocks are remembered (a Walk; None: not yet).
    prefix_hit: int = 0
    num_cached_tokens: int = 0  # prefix_hit at its first admission, for its RequestOutput
    prefix_walk: Any = None
    cache_salt: str | None = None  # its prompt's: it finds and leaves cached blocks only under this salt
    first_token_at: float | None = None  # time.monotonic() when its first output token was read back
    scheduled_at: float | None = None  # time.monotonic() when the scheduler first gave it a batch slot
    sampling_row: tuple[int, ...] | None = None  # its packed sampling fields (engine/steps.py), cached
    # The most tokens it will hold: its prompt plus max_tokens, within max_seq_len (fixed at
    # construction, as its prompt, params and max_seq_len are).
    length_limit: int = field(init=False)

    def __post_init__(self) -> None:
        self.length_limit = min(self.max_seq_len, len(self.prompt_ids) + self.max_new_tokens)

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

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt then output."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    def accept(
        self, token: int, logprob: float, top: tuple[list[int], list[float]] | None = None, rank: int = 1
    ) -> None:
        """Record one read-back token and decide whether the request is done."""
        self.num_pending -= 1
        self.output_ids.append(token)
        p = self.params
        if p.logprobs is not None:
            self.logprobs.append(logprob)
            self.ranks.append(rank)
            if p.logprobs and top is not None:
                k = p.logprobs
                self.top_logprobs.append(top if len(top[0]) == k else (top[0][:k], top[1][:k]))
        # Under min_tokens the sampler bans stop tokens, except where a grammar allowed nothing else
        # (kernels/guided_mask.py): a guided row's stop token then ends it.
        if len(self.output_ids) > p.min_tokens or p.min_tokens == 0 or self.guided is not None:
            # vLLM's order: the tokenizer's EOS (no stop_reason), then stop_token_ids, then the other
            # EOS ids, which vLLM adds to the stop tokens (their id as stop_reason).
            eos = not p.ignore_eos and token in self.eos_ids
            if eos and token == self.primary_eos:
                self.finish_reason = "stop"
                return
            if token in p.stop_token_ids:
                self.finish_reason, self.stop_reason = "stop", token
                return
            if eos:
                self.finish_reason = "stop"
                self.stop_reason = token if self.primary_eos is not None else None
                return
        if len(self.prompt_ids) + len(self.output_ids) >= self.length_limit:
            self.finish_reason = "length"
