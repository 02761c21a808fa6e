"""POST /v1/completions: text (or token-id) prompts, one or many, streamed or not."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..engine.detokenizer import token_text
from ..engine.outputs import CompletionOutput, RequestOutput
from .errors import ServeError, error_body
from .generation import Generation, request_id
from .params import request_keys, sampling_params
from .protocol import CompletionRequest
from .responses import (
    SSE_DONE,
    Envelope,
    TextOffsets,
    Usage,
    chunk_usage,
    completion_choice,
    joined_logprobs,
    prompt_logprobs_part,
    sse,
    worth_sending,
)
from .sse import SSEResponse, unless_disconnected
from .state import ServerState


def _prompts(prompt: Any) -> list[Any]:
    """OpenAI's four prompt shapes -> a list of engine prompts (text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


@dataclass(slots=True)
class Echo:
    """`echo`: each choice starts with its prompt's text, and with `logprobs` its logprobs (vLLM's and
    OpenAI's legacy behaviour, which evaluation harnesses use to score a prompt). `max_tokens: 0`
    echoes the prompt alone: the engine takes one step for the prompt's logprobs, whose token is
    dropped."""

    only: bool
    tokenizer: Any

    def text(self, out: RequestOutput) -> str:
        if out.prompt is not None:
            return out.prompt
        return self.tokenizer.decode(out.prompt_token_ids) if self.tokenizer is not None else ""

    def prefix(self, choice: dict[str, Any], out: RequestOutput, offsets: TextOffsets) -> dict[str, Any]:
        """`choice` (built with `offsets` already past the prompt) with the prompt in front."""
        choice["text"] = self.text(out) + choice["text"]
        if choice["logprobs"] is not None:
            choice["logprobs"] = joined_logprobs(self._prompt_part(out), choice["logprobs"])
        return choice

    def offsets(self, out: RequestOutput, logprobs: bool) -> TextOffsets:
        """Text offsets of a choice's own tokens: they start after the prompt's."""
        offsets = TextOffsets()
        if logprobs:
            self._prompt_part(out, offsets)
        return offsets

    def _prompt_part(self, out: RequestOutput, offsets: TextOffsets | None = None) -> dict[str, list[Any]]:
        ids = out.prompt_token_ids
        first = token_text(self.tokenizer)(ids[0]) if self.tokenizer is not None and ids else ""
        return prompt_logprobs_part(ids, out.prompt_logprobs, first or "", offsets or TextOffsets())

    def trimmed(self, c: CompletionOutput) -> CompletionOutput:
        """What a choice carries of its own: nothing, when the prompt is echoed alone."""
        if not self.only:
            return c
        return dataclasses.replace(
            c, text="", token_ids=[], logprobs=[] if c.logprobs is not None else None,
            finish_reason="length", stop_reason=None,
        )  # fmt: skip


def _echo(body: CompletionRequest, state: ServerState) -> tuple[CompletionRequest, Echo | None]:
    if not body.echo:
        return body, None
    only = body.max_tokens == 0
    if only:
        body = body.model_copy(update={"max_tokens": 1})
    return body, Echo(only, state.llm.get_tokenizer())


async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    state.check_model(body.model)
    body, echo = _echo(body, state)
    params = sampling_params(body, state.config.max_tokens)
    if echo is not None and body.logprobs is not None:
        params = dataclasses.replace(params, prompt_logprobs=body.logprobs)
    prompts = _prompts(body.prompt)
    rid = request_id("cmpl")
    request.state.request_id = rid
    gen = await Generation.start(
        state, lambda: prompts, len(prompts), params, rid, body.stream, request_keys(body)
    )
    request.state.prompt_tokens = gen.prompt_tokens
    env = Envelope(rid, "text_completion", int(time.time()), state.model_name)
    if body.stream:
        return SSEResponse(_events(gen, env, body, params.n, request, echo), gen)
    return await unless_disconnected(request.receive, gen, _respond(gen, env, body, params.n, request, echo))


async def _respond(
    gen: Generation, env: Envelope, body: CompletionRequest, n: int, request: Request, echo: Echo | None
):
    outputs = await gen.collect()
    choices, usage = [], Usage(gen.prompt_tokens)
    logprobs = body.logprobs is not None
    for i, out in enumerate(outputs):
        for c in out.outputs:
            if echo is None:
                usage.completion_tokens += len(c.token_ids)
                choices.append(completion_choice(i * n + c.index, c, body.return_token_ids))
                continue
            c = echo.trimmed(c)
            usage.completion_tokens += len(c.token_ids)
            offsets = echo.offsets(out, logprobs)
            choice = completion_choice(i * n + c.index, c, body.return_token_ids, offsets)
            choices.append(echo.prefix(choice, out, offsets))
    request.state.completion_tokens = usage.completion_tokens
    extra: dict[str, Any] = {}
    if body.return_token_ids:
        extra["prompt_token_ids"] = [out.prompt_token_ids for out in outputs]
    return JSONResponse(env.body(choices, usage=usage.as_dict(), **extra))


async def _events(
    gen: Generation, env: Envelope, body: CompletionRequest, n: int, request: Request, echo: Echo | None
) -> AsyncIterator[bytes]:
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    continuous = include_usage and body.stream_options.continuous_usage_stats
    offsets: dict[int, TextOffsets] = {}
    usage = Usage(gen.prompt_tokens)
    try:
        async for i, out in gen.outputs():
            for c in out.outputs:
                index = i * n + c.index
                echoed = (
                    echo is not None and index not in offsets
                )  # a choice's first chunk carries its prompt
                if echo is not None:
                    if echo.only and not echoed:
                        continue  # the prompt alone went in the first chunk, with the finish
                    c = echo.trimmed(c)
                usage.completion_tokens += len(c.token_ids)
                if not echoed and not worth_sending(c, body.return_token_ids):
                    continue
                if echoed:
                    offsets[index] = echo.offsets(out, body.logprobs is not None)
                choice = completion_choice(
                    index, c, body.return_token_ids, offsets.setdefault(index, TextOffsets())
                )
                if echoed:
                    choice = echo.prefix(choice, out, offsets[index])
                yield sse(env.body([choice], **chunk_usage(usage, include_usage, continuous)))
        if include_usage:
            yield sse(env.body([], usage=usage.as_dict()))
    except ServeError as exc:
        yield sse(error_body(exc.status, exc.message, exc.param))
    finally:
        request.state.completion_tokens = usage.completion_tokens
    yield SSE_DONE
