"""A reasoning model's thinking apart from its answer, as vLLM's --reasoning-parser splits it.

- `deepseek_r1` (DeepSeek R1 and its distills, QwQ, and thinking models whose template opens the
  `<think>` block in the prompt): everything up to `</think>` is reasoning (a leading `<think>` is
  dropped), the rest the answer; a reply without `</think>` is all reasoning (cut by max_tokens).
- `qwen3` (Qwen3, whose thinking is switched by `chat_template_kwargs.enable_thinking`): a reply that
  opens with `<think>` reasons until `</think>`; one that does not is all answer.

The answer then goes to the tool-call parser, if any. Under a grammar (response_format, a named or
required tool) the model thinks freely and the grammar holds the reply from the token after `</think>`
(chat._after_reasoning; GuidedDecodingParams.after_reasoning), so the reply splits the same way; where
`</think>` is not one token, or the prompt already closed the thinking (ChatRun.judging), the grammar
holds the reply from its first token and nothing is split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .tool_calls import held_back

OPEN, CLOSE = "<think>", "</think>"


def split(parser: str, text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a whole reply; reasoning None when the reply has none."""
    if parser == "qwen3":
        head = text.lstrip()
        if not head.startswith(OPEN):
            return None, text
        text = head[len(OPEN) :]
        reasoning, found, answer = text.partition(CLOSE)
        return reasoning, answer if found else ""
    if parser == "deepseek_r1":
        head = text.lstrip()
        if head.startswith(OPEN):
            text = head[len(OPEN) :]
        reasoning, found, answer = text.partition(CLOSE)
        return reasoning, answer if found else ""
    raise ValueError(f"unknown reasoning parser {parser!r}")


def reasoning_tokens(parser: str, tokenizer: Any, token_ids: Sequence[int], text: str) -> int:
    """How many of a reply's tokens were its thinking (the `<think>` markers not counted), for usage's
    `reasoning_tokens`: counted in the token ids where `</think>` is one token, else the reasoning's text
    encoded again."""
    reasoning, _ = split(parser, text)
    if not reasoning or tokenizer is None:
        return 0
    ids = list(token_ids)
    start = 0  # the thinking's first token: past a leading <think> and what came before it
    if text.lstrip().startswith(OPEN):
        opening = _single_token(tokenizer, OPEN)
        if opening is not None and opening in ids:
            start = ids.index(opening) + 1
        else:
            start = len(tokenizer.encode(text[: text.index(OPEN) + len(OPEN)], add_special_tokens=False))
    if CLOSE not in text:  # the whole reply is thinking (cut by max_tokens, or its template opened it)
        return max(0, len(ids) - start)
    close = _single_token(tokenizer, CLOSE)
    if close is not None and close in ids:
        return max(0, ids.index(close) - start)
    return len(tokenizer.encode(reasoning, add_special_tokens=False))


def _single_token(tokenizer: Any, marker: str) -> int | None:
    ids = tokenizer.encode(marker, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


class ReasoningStream:
    """A streamed reply split as `split` splits it whole: each piece of text gives (reasoning, answer)
    to send now. Text that may be the start of a `<think>` or `</think>` waits for the next piece."""

    def __init__(self, parser: str) -> None:
        self.parser = parser
        self.pending = ""  # text not yet sent, held back for a marker it may begin
        self.state = "start"  # start: before the reply's first characters; think; answer
        self.reasoned = False  # the reply had a reasoning part (so the answer may be empty)

    def feed(self, text: str, finished: bool) -> tuple[str, str]:
        self.pending += text
        reasoning = answer = ""
        if self.state == "start":
            head = self.pending.lstrip()
            if not finished and len(head) < len(OPEN) and OPEN.startswith(head):
                return "", ""  # "", "<", "<thi": not known yet
            if head.startswith(OPEN):
                self.state, self.reasoned, self.pending = "think", True, head[len(OPEN) :]
            elif self.parser == "deepseek_r1":
                self.state, self.reasoned = "think", True  # its template opened the block
            else:
                self.state = "answer"
        if self.state == "think":
            before, found, after = self.pending.partition(CLOSE)
            if found:
                reasoning, self.pending, self.state = before, after, "answer"
            else:
                keep = 0 if finished else held_back(self.pending, CLOSE)
                reasoning, self.pending = (
                    self.pending[: len(self.pending) - keep],
                    self.pending[len(self.pending) - keep :],
                )
        if self.state == "answer":
            answer, self.pending = self.pending, ""
        return reasoning, answer
