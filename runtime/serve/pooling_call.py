"""What /v1/embeddings, /score and /rerank share: the model or LoRA adapter the request names, a
request id, one place at the admission gate, the work in parts so a client that leaves stops it, the
engine's errors as HTTP errors that name the field (and the item in it) at fault, and the usage and
list envelope of the reply."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ..engine.outputs import EngineClosedError
from ..engine.pooling import PoolingParams
from ..runner.kv_cache import CacheFullError
from .errors import RequestInvalid, ServeError, Unavailable
from .generation import client_request_id, request_id
from .state import ServerState

PART = 64  # prompts an engine call: a client that leaves stops the work within one part
_PROMPT = re.compile(r"^(?:embed|token_embed) prompt (\d+): ")

# A part's prompt index -> (the request's field, what the message calls it: "documents[3]").
Locate = Callable[[int], tuple[str, str]]


class ClientGone(ServeError):
    status = 499


def check_truncation(state: ServerState, value: int | None) -> None:
    """truncate_prompt_tokens as PoolingParams takes it, and no longer than the context (vLLM's 400)."""
    if value is None:
        return
    try:
        PoolingParams(truncate_prompt_tokens=value)
    except ValueError as exc:
        raise RequestInvalid(str(exc), "truncate_prompt_tokens") from None
    limit = state.llm.config.max_seq_len
    if value > limit:
        raise RequestInvalid(
            f"truncate_prompt_tokens ({value}) is greater than max_model_len ({limit})",
            "truncate_prompt_tokens",
        )


@dataclass(slots=True)
class Pooled:
    """A pooling request's results: its id, each prompt's output in order, the model name to reply
    with, and the prompt tokens the outputs count (also set on the request, for the access log)."""

    rid: str
    outs: list[Any]
    model: str
    tokens: int

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.tokens, "total_tokens": self.tokens, "completion_tokens": 0}

    def list_response(self, data: list[dict[str, Any]]) -> JSONResponse:
        """OpenAI's list envelope (/v1/embeddings, /score) around `data`."""
        return JSONResponse({"id": self.rid, "object": "list", "created": int(time.time()), "model": self.model,
                             "data": data, "usage": self.usage()})  # fmt: skip


async def run_pooling(request: Request, prefix: str, model: str | None,
                      parts: Sequence[tuple[Callable[[Any], list[Any]], Locate]]) -> Pooled:  # fmt: skip
    """The parts' results, each part's call run off the event loop with the request's LoRARequest
    (None: the base model)."""
    state: ServerState = request.app.state.fastpath
    lora = state.check_model(model)  # a LoRARequest when `model` names an adapter
    client = client_request_id(request.headers.get("x-request-id"))
    rid = request_id(prefix, client)
    request.state.request_id = rid
    request.state.client_request_id = client  # echoed as sent in the X-Request-Id header
    state.gate.enter(1)  # one place: its prompts run between the engine's steps, a step at a time
    out: list[Any] = []
    try:
        for i, (call, locate) in enumerate(parts):
            if i and await request.is_disconnected():
                raise ClientGone("the client left before its results were ready")
            try:
                out += await run_in_threadpool(call, lora)
            except (ValueError, TypeError) as exc:  # TypeError: text the tokenizer cannot take
                message = str(exc)
                found = _PROMPT.match(message)
                param, label = locate(int(found.group(1)) if found else 0)
                if found:
                    message = f"{label}: {message[found.end() :]}"
                raise RequestInvalid(message, param) from None
    except (EngineClosedError, CacheFullError, TimeoutError) as exc:  # TimeoutError: the engine process
        raise Unavailable(str(exc)) from None
    finally:
        state.gate.leave(1)
    tokens = sum(len(o.prompt_token_ids) for o in out)
    request.state.prompt_tokens = tokens
    return Pooled(rid, out, state.reply_name(model, lora), tokens)


def in_parts(n: int) -> list[range]:
    return [range(i, min(n, i + PART)) for i in range(0, n, PART)]
