"""What generate(), chat() and stream() hand back, shaped like vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    """One token's log-probability under the model's own distribution, its rank there, and its text."""

    logprob: float
    rank: int | None = None  # 1 is the most likely token
    decoded_token: str | None = None


# Per position: token id -> Logprob, the top-k and the chosen token.
PositionLogprobs = dict[int, Logprob]


@dataclass(slots=True)
class CompletionOutput:
    """One of a request's `n` completions. From stream(), text and token_ids are what is new."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    error: str | None = None  # why the request failed alone, when it did (finish_reason "error")


class RequestError(ValueError):
    """Some requests were invalid. The valid ones still ran: their outputs are in `.outputs`."""

    def __init__(self, message: str, outputs: list[RequestOutput]) -> None:
        super().__init__(message)
        self.outputs = outputs


class EngineClosedError(RuntimeError):
    """The engine was closed (by close(), or after an error it could not survive); the message says why."""
