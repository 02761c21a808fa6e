"""OpenAI's /v1/embeddings over `LLM.embed` (engine/pooling.py): the server's base model pooled as
its pooler config says, each input one vector, as floats or as base64 of little-endian float32."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..engine.pooling import PoolingParams
from .errors import RequestInvalid
from .pooling_call import check_truncation, in_parts, run_pooling
from .protocol import EmbeddingRequest
from .state import ServerState
from .tokenizer_routes import render_chat_ids, tokenizer_of


async def create_embedding(body: EmbeddingRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    if body.messages is not None:
        state.check_chat_template(body.chat_template)
        tokenizer_of(state)  # a 400 where the model has none
        inputs = [{"prompt_token_ids": await run_in_threadpool(render_chat_ids, state, body)}]
    else:
        inputs = _inputs(body.input)
    check_truncation(state, body.truncate_prompt_tokens)
    try:
        params = PoolingParams(body.truncate_prompt_tokens, body.dimensions, body.normalize)
    except ValueError as exc:
        raise RequestInvalid(str(exc), "truncate_prompt_tokens") from None
    hidden = state.llm.config.model.hidden_size
    if body.dimensions is not None and body.dimensions > hidden:
        raise RequestInvalid(f"dimensions {body.dimensions} is more than the model's {hidden}", "dimensions")
    one = body.messages is not None or isinstance(body.input, str)
    one = one or (bool(body.input) and isinstance(body.input[0], int))
    field = "messages" if body.messages is not None else "input"
    parts = []
    for span in in_parts(len(inputs)):

        def call(lora, chunk=inputs[span.start : span.stop]):
            return state.llm.embed(chunk, params, use_tqdm=False, lora_request=lora)

        def locate(k, start=span.start):
            return field, field if one else f"input[{start + k}]"

        parts.append((call, locate))
    pooled = await run_pooling(request, "embd", body.model, parts)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(o.outputs.embedding, body.encoding_format)}
        for i, o in enumerate(pooled.outs)
    ]
    return pooled.list_response(data)


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
