"""A chat choice's text as the message the client gets: the reasoning apart (reasoning.py), then the
answer's tool calls (tool_calls.py), whole or piece by piece as a stream sends them.

The reasoning goes out as `reasoning`, vLLM's field, and as `reasoning_content`, its name before vLLM
0.11, which clients still read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .reasoning import ReasoningStream, split
from .tool_calls import ToolPlan, ToolStream


@dataclass(frozen=True, slots=True)
class ReplyShape:
    """How one request's choices are read: `reasoning` the parser (None: no split), `tools` the plan."""

    tools: ToolPlan
    reasoning: str | None = None
    include_reasoning: bool = True

    @property
    def plain(self) -> bool:
        """Whether the text is the content as it is."""
        return self.reasoning is None and self.tools.mode == "none"

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """(the choice's message, its finish_reason) for a whole reply."""
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = split(self.reasoning, text)
        content, calls = self.tools.extract(text)
        if reasoning is not None and not content:
            content = None
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [c.as_dict() for c in calls]
        if reasoning and self.include_reasoning:  # "<think></think>": none, as a stream sends it
            message["reasoning"] = message["reasoning_content"] = reasoning
        return message, self.tools.finish_reason(finish_reason, calls)

    def stream(self) -> ReplyStream:
        return ReplyStream(self)


class ReplyStream:
    """One streamed choice: each piece of its text gives the delta to send (empty: nothing yet)."""

    def __init__(self, shape: ReplyShape) -> None:
        self.shape = shape
        self.thinking = ReasoningStream(shape.reasoning) if shape.reasoning else None
        self.tools = ToolStream(shape.tools)

    def feed(self, text: str, finished: bool) -> dict[str, Any]:
        reasoning = ""
        if self.thinking is not None:
            reasoning, text = self.thinking.feed(text, finished)
        content, calls = self.tools.feed(text, finished)
        delta: dict[str, Any] = {}
        if reasoning and self.shape.include_reasoning:
            delta["reasoning"] = delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta

    def finish_reason(self, engine_reason: str | None) -> str | None:
        return self.shape.tools.finish_reason(engine_reason, self.tools.calls)
