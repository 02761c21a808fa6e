"""OpenAI's /v1/embeddings over `LLM.embed` (engine/pooling.py): the server's base model pooled as
its pooler config says, each input one vector, as floats or as base64 of little-endian float32."""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..engine.outputs import EngineClosedError
from ..engine.pooling import PoolingParams
from ..runner.kv_cache import CacheFullError
from .errors import RequestInvalid, Unavailable
from .generation import client_request_id, request_id
from .protocol import EmbeddingRequest
from .state import ServerState


async def create_embedding(body: EmbeddingRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    if state.check_model(body.model) is not None:
        raise RequestInvalid(
            f"model: embeddings pool the base model; {body.model!r} is a LoRA adapter", "model"
        )
    inputs = _inputs(body.input)
    try:
        params = PoolingParams(body.truncate_prompt_tokens, body.dimensions, body.normalize)
    except ValueError as exc:
        raise RequestInvalid(str(exc), "truncate_prompt_tokens") from None
    client = client_request_id(request.headers.get("x-request-id"))
    rid = request_id("embd", client)
    request.state.request_id = rid
    request.state.client_request_id = client  # echoed as sent in the X-Request-Id header
    state.gate.enter(1)  # one place: its prompts run between the engine's steps, a step at a time
    try:
        outs = await run_in_threadpool(state.llm.embed, inputs, params, use_tqdm=False)
    except (EngineClosedError, CacheFullError) as exc:
        raise Unavailable(str(exc)) from None
    except ValueError as exc:
        message = str(exc)
        raise RequestInvalid(message, "dimensions" if "dimensions" in message else "input") from None
    finally:
        state.gate.leave(1)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(o.outputs.embedding, body.encoding_format)}
        for i, o in enumerate(outs)
    ]
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    request.state.prompt_tokens = tokens
    return JSONResponse(
        {
            "id": rid,
            "object": "list",
            "created": int(time.time()),
            "model": state.model_name,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _inputs(given: Any) -> list[Any]:
    """OpenAI's input: a text, a list of texts, a list of token ids, or a list of them."""
    if isinstance(given, str):
        return [given]
    if given and isinstance(given[0], int):
        return [{"prompt_token_ids": given}]
    return [{"prompt_token_ids": g} if isinstance(g, list) else g for g in given]


def _encoded(vector: list[float], encoding_format: str) -> Any:
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
