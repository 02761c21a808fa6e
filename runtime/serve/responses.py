"""Response bodies and stream chunks in OpenAI's shapes, from the engine's RequestOutputs.

Plain dicts: a stream sends one per step per request, and building them must stay cheap.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..engine.outputs import CompletionOutput, PositionLogprobs

# JSON has no -inf; a token the model rules out entirely gets vLLM's floor instead.
LOGPROB_FLOOR = -9999.0


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens the prefix cache held, as OpenAI reports them; None (left out) without the cache.
    cached_tokens: int | None = None

    def as_dict(self) -> dict[str, Any]:
        total = self.prompt_tokens + self.completion_tokens
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }
        if self.cached_tokens is not None:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return out

    def cached(self, caching: bool, per_prompt: dict[int, int]) -> Usage:
        """With the engine's prefix cache on, the cached prompt tokens of each prompt, summed."""
        self.cached_tokens = sum(per_prompt.values()) if caching else None
        return self


def prefix_caching(llm: Any) -> bool:
    return bool(getattr(llm.config, "enable_prefix_caching", False))


def chunk_usage(usage: Usage, include: bool, continuous: bool) -> dict[str, Any]:
    """A stream chunk's `usage`: absent unless asked; null until the last chunk, or, with vLLM's
    `continuous_usage_stats`, the counts so far."""
    if not include:
        return {}
    return {"usage": usage.as_dict() if continuous else None}


@dataclass(slots=True)
class Envelope:
    """What every body of one response carries."""

    id: str
    object: str
    created: int
    model: str

    def body(self, choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **more,
        }


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def _lp(value: float) -> float:
    return value if value > LOGPROB_FLOOR else LOGPROB_FLOOR


def _text(entry: Any) -> str:
    return entry.decoded_token if entry.decoded_token is not None else ""


@dataclass(slots=True)
class TextOffsets:
    """Completions logprobs carry each token's offset in the text; a stream continues where it left off."""

    offset: int = 0


def spelled_as_id(token: int) -> str:
    """vLLM's `return_tokens_as_token_ids` spelling: every token distinct, whatever its text."""
    return f"token_id:{token}"


def completion_logprobs(
    c: CompletionOutput, offsets: TextOffsets | None = None, as_ids: bool = False
) -> dict[str, list[Any]] | None:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset. `as_ids`:
    tokens (and top_logprobs' keys) spelled "token_id:<id>"; offsets stay those of the text."""
    if c.logprobs is None:
        return None
    offsets = offsets or TextOffsets()
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, position in zip(c.token_ids, c.logprobs, strict=False):
        chosen = position[token]
        text = _text(chosen)
        key = spelled_as_id(token) if as_ids else text
        out["tokens"].append(key)
        out["token_logprobs"].append(_lp(chosen.logprob))
        # vLLM's shape: the top-k and the chosen token (when it is not among them)
        # Two tokens can spell the same text: the more likely one keeps the key.
        top: dict[str, float] = {}
        for t, e in _ranked_items(position):
            top.setdefault(spelled_as_id(t) if as_ids else _text(e), _lp(e.logprob))
        top.setdefault(key, _lp(chosen.logprob))
        out["top_logprobs"].append(top)
        out["text_offset"].append(offsets.offset)
        offsets.offset += len(text)
    return out


TokenBytes = Callable[[int], bytes]


def chat_logprobs(
    c: CompletionOutput, top: int = 0, raw: TokenBytes | None = None, as_ids: bool = False
) -> dict[str, list[Any]] | None:
    """The chat shape: per token its text, logprob, bytes and exactly its `top` most likely
    alternatives (the request's top_logprobs; the sampled token is listed there only when it is one of
    them, as OpenAI and vLLM do). `raw`: a token's own bytes (a piece of a multi-byte character has its
    bytes, not U+FFFD's). `as_ids`: each token spelled "token_id:<id>", its bytes that text's (vLLM's)."""
    if c.logprobs is None:
        return None
    content = []
    for token, position in zip(c.token_ids, c.logprobs, strict=False):
        content.append(
            {
                **_token(token, position[token], raw, as_ids),
                "top_logprobs": [_token(t, e, raw, as_ids) for t, e in _ranked_items(position)[:top]],
            }
        )
    return {"content": content}


def _ranked_items(position: PositionLogprobs) -> list[tuple[int, Any]]:
    return sorted(((t, e) for t, e in position.items() if e.rank is not None), key=lambda te: te[1].rank)


def _token(token: int, entry: Any, raw: TokenBytes | None, as_ids: bool = False) -> dict[str, Any]:
    if as_ids:
        text = spelled_as_id(token)
        return {"token": text, "logprob": _lp(entry.logprob), "bytes": list(text.encode())}
    text = _text(entry)
    spelled = raw(token) if raw is not None and entry.decoded_token is not None else text.encode("utf-8")
    return {"token": text, "logprob": _lp(entry.logprob), "bytes": list(spelled)}


def prompt_logprobs_part(
    prompt_ids: list[int],
    positions: list[PositionLogprobs | None] | None,
    first_text: str,
    offsets: TextOffsets,
    as_ids: bool = False,
    top_k: int | None = None,
) -> dict[str, list[Any]]:
    """An echoed prompt in the completions logprobs shape: the first token has no logprob (nothing
    precedes it), as in vLLM and OpenAI's legacy API. `first_text` spells the first token. `as_ids`:
    as completion_logprobs'. `top_k`: the alternatives listed (the engine may hold more, for a
    request's larger prompt_logprobs)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for j, token in enumerate(prompt_ids):
        position = positions[j] if positions is not None and j < len(positions) else None
        if position is None or token not in position:
            text, logprob, top = first_text if j == 0 else "", None, None
            key = spelled_as_id(token) if as_ids else text
        else:
            chosen = position[token]
            text, logprob = _text(chosen), _lp(chosen.logprob)
            key = spelled_as_id(token) if as_ids else text
            top = {}
            for t, e in _ranked_items(position)[:top_k]:
                top.setdefault(spelled_as_id(t) if as_ids else _text(e), _lp(e.logprob))
            top.setdefault(key, logprob)
        out["tokens"].append(key)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offsets.offset)
        offsets.offset += len(text)
    return out


def vllm_prompt_logprobs(
    prompt_ids: list[int], positions: list[PositionLogprobs | None] | None, top_k: int
) -> list[Any] | None:
    """A request's `prompt_logprobs` as vLLM's server returns them: per prompt token (the first has
    none) its {token id: {logprob, rank, decoded_token}}, the prompt's token and the `top_k` likeliest
    (the engine may hold more, for an echo's larger logprobs)."""
    if positions is None:
        return None
    return [
        None
        if position is None
        else {
            str(t): {"logprob": _lp(e.logprob), "rank": e.rank, "decoded_token": e.decoded_token}
            for t, e in position.items()
            if t == token or (e.rank is not None and e.rank <= top_k)
        }
        for token, position in zip(prompt_ids, positions, strict=False)
    ]


def joined_logprobs(first: dict[str, list[Any]], then: dict[str, list[Any]] | None) -> dict[str, list[Any]]:
    return first if then is None else {key: first[key] + then[key] for key in first}


def completion_choice(
    index: int,
    c: CompletionOutput,
    return_token_ids: bool,
    offsets: TextOffsets | None = None,
    as_ids: bool = False,
) -> dict[str, Any]:
    choice = {
        "index": index,
        "text": c.text,
        "logprobs": completion_logprobs(c, offsets, as_ids),
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }
    if return_token_ids:
        choice["token_ids"] = list(c.token_ids)
    return choice


def chat_choice(
    index: int,
    c: CompletionOutput,
    return_token_ids: bool,
    raw: TokenBytes | None = None,
    top: int = 0,
    as_ids: bool = False,
    key: str = "message",
) -> dict[str, Any]:
    """A chat choice: its whole `message`, or (`key` "delta", as chat_delta) a stream chunk's piece."""
    said = {"role": "assistant", "content": c.text} if key == "message" else {"content": c.text}
    choice = {
        "index": index,
        key: said,
        "logprobs": chat_logprobs(c, top, raw, as_ids),
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }
    if return_token_ids:
        choice["token_ids"] = list(c.token_ids)
    return choice


def chat_delta(
    index: int,
    c: CompletionOutput,
    return_token_ids: bool,
    raw: TokenBytes | None = None,
    top: int = 0,
    as_ids: bool = False,
) -> dict[str, Any]:
    return chat_choice(index, c, return_token_ids, raw, top, as_ids, key="delta")


def worth_sending(c: CompletionOutput, token_ids: bool) -> bool:
    """Whether a stream sends this delta now. Tokens whose text is held back (part of a character, a
    possible stop string) wait for the next chunk, unless the client asked for token ids or logprobs."""
    return bool(c.text or c.finish_reason or (c.token_ids and (token_ids or c.logprobs)))
