"""What generate(), chat() and stream() hand back, shaped like vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .sampling_params import doc


@dataclass(slots=True)
class Logprob:
    """One token's log-probability under the model's own distribution, its rank there, and its text."""

    logprob: float = field(metadata=doc("Log-probability under the model's raw distribution."))
    rank: int | None = field(
        default=None,
        metadata=doc(
            "1 is the most likely token: 1 + how many tokens the model rated higher (vLLM's). The "
            "chosen token always has it, in or out of the top-k, as do top-k entries and prompt tokens."
        ),
    )
    decoded_token: str | None = field(default=None, metadata=doc("The token's text."))


# Per position: token id -> Logprob, the top-k and the chosen token.
PositionLogprobs = dict[int, Logprob]


@dataclass(slots=True)
class CompletionOutput:
    """One of a request's `n` completions. From stream(), text and token_ids are what is new."""

    index: int = field(metadata=doc("Which of the request's n completions."))
    text: str = field(metadata=doc("The generated text (from stream(): what is new)."))
    token_ids: list[int] = field(metadata=doc("The generated token ids (from stream(): what is new)."))
    cumulative_logprob: float | None = field(
        default=None, metadata=doc("Sum of the chosen tokens' logprobs.")
    )
    logprobs: list[PositionLogprobs] | None = field(
        default=None, metadata=doc("Per generated token: token id -> Logprob, when the request asked.")
    )
    finish_reason: str | None = field(
        default=None, metadata=doc("stop, length, abort or error; None while running.")
    )
    stop_reason: int | str | None = field(
        default=None, metadata=doc("The stop string or stop token id that ended it; None for EOS or length.")
    )
    lora_request: Any = field(default=None, metadata=doc("The LoRARequest it ran with, if any (vLLM's)."))

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str = field(metadata=doc("The id given to submit(), else the engine's counter."))
    prompt: str | None = field(metadata=doc("The prompt's text, when it was given as text."))
    prompt_token_ids: list[int] = field(metadata=doc("The prompt as token ids."))
    prompt_logprobs: list[PositionLogprobs | None] | None = field(
        default=None, metadata=doc("Per prompt token, when the request asked; the first is None.")
    )
    outputs: list[CompletionOutput] = field(default_factory=list, metadata=doc("One per completion (n)."))
    finished: bool = field(default=False, metadata=doc("Whether every completion has ended."))
    error: str | None = field(
        default=None, metadata=doc("Why the request failed alone (finish_reason error).")
    )
    num_cached_tokens: int = field(
        default=0,
        metadata=doc(
            "Prompt tokens the prefix cache held when the request was first scheduled (its first "
            "completion's; 0 without enable_prefix_caching)."
        ),
    )
    lora_request: Any = field(default=None, metadata=doc("The LoRARequest it ran with, if any (vLLM's)."))
    # vLLM's fields for what fastpath does not do, present so code that reads them runs.
    metrics: Any = field(
        default=None, metadata=doc("vLLM's per-request timings: None (llm.stats() and /metrics have them).")
    )
    encoder_prompt: str | None = field(default=None, metadata=doc("None: decoder-only models."))
    encoder_prompt_token_ids: list[int] | None = field(
        default=None, metadata=doc("None: decoder-only models.")
    )
    kv_transfer_params: dict[str, Any] | None = field(
        default=None, metadata=doc("None: no disaggregated prefill.")
    )
    multi_modal_placeholders: dict[str, Any] = field(
        default_factory=dict, metadata=doc("Empty: text-only models.")
    )


@dataclass(slots=True)
class EmbeddingOutput:
    embedding: list[float] = field(metadata=doc("The prompt's embedding (engine/pooling.py)."))

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass(slots=True)
class EmbeddingRequestOutput:
    """What embed() returns, one per prompt: vLLM's."""

    request_id: str = field(metadata=doc("The engine's counter."))
    outputs: EmbeddingOutput = field(metadata=doc("The embedding."))
    prompt_token_ids: list[int] = field(metadata=doc("The prompt as token ids (after truncation)."))
    finished: bool = field(default=True, metadata=doc("Always True."))


@dataclass(slots=True)
class PoolingOutput:
    data: Any = field(metadata=doc("A float32 tensor: [H] for embed, [tokens, H] for token_embed."))


@dataclass(slots=True)
class PoolingRequestOutput:
    """What encode() returns, one per prompt: vLLM's."""

    request_id: str = field(metadata=doc("The engine's counter."))
    outputs: PoolingOutput = field(metadata=doc("The pooled data."))
    prompt_token_ids: list[int] = field(metadata=doc("The prompt as token ids (after truncation)."))
    finished: bool = field(default=True, metadata=doc("Always True."))


@dataclass(slots=True)
class ScoringOutput:
    score: float = field(metadata=doc("The cosine similarity of the pair's embeddings."))


@dataclass(slots=True)
class ScoringRequestOutput:
    """What score() returns, one per pair: vLLM's."""

    request_id: str = field(metadata=doc("The engine's counter (the second text's embedding's)."))
    outputs: ScoringOutput = field(metadata=doc("The score."))
    prompt_token_ids: list[int] = field(metadata=doc("The pair's token ids: the first's, then the second's."))
    finished: bool = field(default=True, metadata=doc("Always True."))


class RequestError(ValueError):
    """Some requests were invalid. The valid ones still ran: their outputs are in `.outputs`."""

    def __init__(self, message: str, outputs: list[RequestOutput]) -> None:
        super().__init__(message)
        self.outputs = outputs


class EngineClosedError(RuntimeError):
    """The engine was closed (by close(), or after an error it could not survive); the message says why."""
