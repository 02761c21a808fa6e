"""What generate() and stream() hand back."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestOutput:
    index: int  # position in the prompts given to generate()
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)  # new tokens only
    text: str | None = None  # when a tokenizer exists
    finish_reason: str | None = None  # "stop" | "length" | "error"
    logprobs: list[float] | None = None  # of the chosen tokens, when requested
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StreamToken:
    index: int
    token_id: int
    finish_reason: str | None  # set on a request's last token


class RequestError(ValueError):
    """Some requests were invalid. The valid ones still ran: their outputs are in `.outputs`."""

    def __init__(self, message: str, outputs: list[RequestOutput]) -> None:
        super().__init__(message)
        self.outputs = outputs
