"""POST /v1/completions: text (or token-id) prompts, one or many, streamed or not."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from .errors import RequestInvalid, ServeError, error_body
from .generation import Generation, request_id
from .params import request_keys, sampling_params
from .protocol import CompletionRequest
from .responses import SSE_DONE, Envelope, TextOffsets, Usage, completion_choice, sse, worth_sending
from .sse import SSEResponse, unless_disconnected
from .state import ServerState


def _prompts(prompt: Any) -> list[Any]:
    """OpenAI's four prompt shapes -> a list of engine prompts (text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    state.check_model(body.model)
    if body.echo:
        raise RequestInvalid("echo is not supported", "echo")
    params = sampling_params(body, state.config.max_tokens)
    prompts = _prompts(body.prompt)
    rid = request_id("cmpl")
    request.state.request_id = rid
    gen = await Generation.start(
        state, lambda: prompts, len(prompts), params, rid, body.stream, request_keys(body)
    )
    request.state.prompt_tokens = gen.prompt_tokens
    env = Envelope(rid, "text_completion", int(time.time()), state.model_name)
    if body.stream:
        return SSEResponse(_events(gen, env, body, params.n, request), gen)
    return await unless_disconnected(request.receive, gen, _respond(gen, env, body, params.n, request))


async def _respond(gen: Generation, env: Envelope, body: CompletionRequest, n: int, request: Request):
    outputs = await gen.collect()
    choices, usage = [], Usage(gen.prompt_tokens)
    for i, out in enumerate(outputs):
        for c in out.outputs:
            usage.completion_tokens += len(c.token_ids)
            choices.append(completion_choice(i * n + c.index, c, body.return_token_ids))
    request.state.completion_tokens = usage.completion_tokens
    extra: dict[str, Any] = {}
    if body.return_token_ids:
        extra["prompt_token_ids"] = [out.prompt_token_ids for out in outputs]
    return JSONResponse(env.body(choices, usage=usage.as_dict(), **extra))


async def _events(
    gen: Generation, env: Envelope, body: CompletionRequest, n: int, request: Request
) -> AsyncIterator[bytes]:
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    more = {"usage": None} if include_usage else {}
    offsets: dict[int, TextOffsets] = {}
    usage = Usage(gen.prompt_tokens)
    try:
        async for i, out in gen.outputs():
            for c in out.outputs:
                usage.completion_tokens += len(c.token_ids)
                if not worth_sending(c, body.return_token_ids):
                    continue
                index = i * n + c.index
                choice = completion_choice(
                    index, c, body.return_token_ids, offsets.setdefault(index, TextOffsets())
                )
                yield sse(env.body([choice], **more))
        if include_usage:
            yield sse(env.body([], usage=usage.as_dict()))
    except ServeError as exc:
        yield sse(error_body(exc.status, exc.message, exc.param))
    finally:
        request.state.completion_tokens = usage.completion_tokens
    yield SSE_DONE
