"""What /v1/embeddings, /score and /rerank share: the base model only, a request id, one place at the
admission gate, and the engine's errors as HTTP errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from ..engine.outputs import EngineClosedError
from ..runner.kv_cache import CacheFullError
from .errors import RequestInvalid, Unavailable
from .generation import client_request_id, request_id
from .state import ServerState

T = TypeVar("T")


async def run_pooling(request: Request, prefix: str, model: str | None, call: Callable[[], T],
                      bad_value: Callable[[str], str]) -> tuple[str, T]:  # fmt: skip
    """(request id, `call()`'s result), `call` run off the event loop. A ValueError from it is a 400
    whose param `bad_value(message)` names."""
    state: ServerState = request.app.state.fastpath
    if state.check_model(model) is not None:
        raise RequestInvalid(f"model: pooling runs the base model; {model!r} is a LoRA adapter", "model")
    client = client_request_id(request.headers.get("x-request-id"))
    rid = request_id(prefix, client)
    request.state.request_id = rid
    request.state.client_request_id = client  # echoed as sent in the X-Request-Id header
    state.gate.enter(1)  # one place: its prompts run between the engine's steps, a step at a time
    try:
        return rid, await run_in_threadpool(call)
    except (EngineClosedError, CacheFullError) as exc:
        raise Unavailable(str(exc)) from None
    except ValueError as exc:
        raise RequestInvalid(str(exc), bad_value(str(exc))) from None
    finally:
        state.gate.leave(1)


def usage(tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}
