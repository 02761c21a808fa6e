"""POST /v1/completions: text (or token-id) prompts, one or many, streamed or not."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..engine.admission import salted
from ..engine.outputs import CompletionOutput, RequestOutput
from .beam import BeamGeneration, beam_params
from .errors import ServeError, error_body
from .generation import Generation, client_request_id, request_id
from .params import check_room, request_keys, sampling_params
from .protocol import CompletionRequest
from .responses import (
    SSE_DONE,
    Envelope,
    TextOffsets,
    Usage,
    chunk_usage,
    completion_choice,
    joined_logprobs,
    prefix_caching,
    prompt_logprobs_part,
    sse,
    vllm_prompt_logprobs,
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


def _tokenized(prompt: Any, body: CompletionRequest, state: ServerState) -> Any:
    """A text prompt with its token ids (so max_tokens is checked against the room it leaves)."""
    tokenizer = state.llm.get_tokenizer()
    if isinstance(prompt, str) and tokenizer is not None:
        ids = list(tokenizer(prompt, add_special_tokens=body.add_special_tokens)["input_ids"])
        prompt = {"prompt": prompt, "prompt_token_ids": ids}
    ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt
    check_room(len(ids), body, state.llm.config.max_seq_len)
    return salted(prompt, body.cache_salt)


@dataclass(slots=True)
class Echo:
    """`echo`: each choice starts with its prompt's text, and with `logprobs` its logprobs (vLLM's and
    OpenAI's legacy behaviour, which evaluation harnesses use to score a prompt). `max_tokens: 0`
    echoes the prompt alone: the engine takes one step for the prompt's logprobs, whose token is
    dropped. Each prompt's part is built once, however many choices share it."""

    only: bool
    logprobs: bool
    tokenizer: Any
    as_ids: bool = False  # return_tokens_as_token_ids
    top_k: int | None = None  # the request's logprobs: the alternatives each prompt token lists
    _parts: dict[int, tuple[str, dict[str, list[Any]] | None, int]] = field(default_factory=dict)

    def offsets(self, i: int, out: RequestOutput) -> TextOffsets:
        """Text offsets of a choice's own tokens: they start after its prompt's."""
        return TextOffsets(self._part(i, out)[2])

    def prefix(self, choice: dict[str, Any], i: int, out: RequestOutput) -> dict[str, Any]:
        """`choice` (built with `offsets(i, out)`) with prompt i in front."""
        text, logprobs, _ = self._part(i, out)
        choice["text"] = text + choice["text"]
        if choice["logprobs"] is not None and logprobs is not None:
            choice["logprobs"] = joined_logprobs(logprobs, choice["logprobs"])
        return choice

    def trimmed(self, c: CompletionOutput) -> CompletionOutput:
        """What a choice carries of its own: nothing, when the prompt is echoed alone."""
        if not self.only:
            return c
        return dataclasses.replace(
            c, text="", token_ids=[], logprobs=[] if c.logprobs is not None else None,
            finish_reason="length", stop_reason=None,
        )  # fmt: skip

    def _part(self, i: int, out: RequestOutput) -> tuple[str, dict[str, list[Any]] | None, int]:
        """(prompt i's text, its logprobs part, the text offset after it)."""
        if i not in self._parts:
            ids = out.prompt_token_ids
            if out.prompt is not None:
                text = out.prompt
            else:
                text = self.tokenizer.decode(ids) if self.tokenizer is not None else ""
            logprobs, offsets = None, TextOffsets()
            if self.logprobs:
                # Spelled alone, as it starts a text (a SentencePiece decoder drops its leading space).
                first = self.tokenizer.decode(ids[:1]) if self.tokenizer is not None and ids else ""
                positions = out.prompt_logprobs
                logprobs = prompt_logprobs_part(ids, positions, first, offsets, self.as_ids, self.top_k)
            self._parts[i] = (text, logprobs, offsets.offset)
        return self._parts[i]


def _echo(body: CompletionRequest, state: ServerState) -> tuple[CompletionRequest, Echo | None]:
    if not body.echo:
        return body, None
    only = body.max_tokens == 0
    if only:
        body = body.model_copy(update={"max_tokens": 1})
    tokenizer = state.llm.get_tokenizer()
    return body, Echo(
        only, body.logprobs is not None, tokenizer, body.return_tokens_as_token_ids, body.logprobs
    )


async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    if body.return_tokens_as_token_ids is None:  # the request's own choice, else the server's
        body = body.model_copy(update={"return_tokens_as_token_ids": state.config.return_tokens_as_token_ids})
    lora = state.check_model(body.model)
    body, echo = _echo(body, state)
    prompt_logprobs = body.logprobs if echo is not None else None
    params = sampling_params(
        body, state.config.max_tokens, prompt_logprobs, defaults=state.llm.generation_defaults
    )
    prompts = _prompts(body.prompt)

    def engine_prompts() -> list[Any]:
        return [_tokenized(p, body, state) for p in prompts]

    client = client_request_id(request.headers.get("x-request-id"))
    rid = request_id("cmpl", client)
    request.state.request_id = rid
    request.state.client_request_id = client  # echoed as sent in the X-Request-Id header
    if body.use_beam_search:
        beam = beam_params(body, params, body.logprobs)
        keys, truncate = request_keys(body), params.truncate_prompt_tokens
        gen = await BeamGeneration.begin(
            state, engine_prompts, len(prompts), beam, body.logprobs, rid, body.stream, keys, truncate, lora,
            body.cache_salt,
        )  # fmt: skip
    else:
        gen = await Generation.start(
            state, engine_prompts, len(prompts), params, rid, body.stream, request_keys(body), lora
        )
    request.state.prompt_tokens = gen.prompt_tokens
    request.state.timeline = gen.timeline
    env = Envelope(rid, "text_completion", int(time.time()), state.reply_name(body.model, lora))
    if body.stream:
        return SSEResponse(_events(gen, env, body, params.n, request, echo), gen)
    return await unless_disconnected(request.receive, gen, _respond(gen, env, body, params.n, request, echo))


async def _respond(
    gen: Generation, env: Envelope, body: CompletionRequest, n: int, request: Request, echo: Echo | None
):
    outputs = await gen.collect()
    choices, usage = [], Usage(gen.prompt_tokens)
    as_ids = body.return_tokens_as_token_ids
    for i, out in enumerate(outputs):
        for c in out.outputs:
            if echo is None:
                usage.completion_tokens += len(c.token_ids)
                choices.append(completion_choice(i * n + c.index, c, body.return_token_ids, None, as_ids))
            else:
                c = echo.trimmed(c)
                usage.completion_tokens += len(c.token_ids)
                offsets = echo.offsets(i, out)
                choice = completion_choice(i * n + c.index, c, body.return_token_ids, offsets, as_ids)
                choices.append(echo.prefix(choice, i, out))
            if body.return_token_ids:  # vLLM's place, in each choice (the list beside them stays)
                choices[-1]["prompt_token_ids"] = out.prompt_token_ids
            if body.prompt_logprobs is not None:  # vLLM's place too (never streamed)
                choices[-1]["prompt_logprobs"] = vllm_prompt_logprobs(
                    out.prompt_token_ids, out.prompt_logprobs, body.prompt_logprobs
                )
    request.state.completion_tokens = usage.completion_tokens
    usage.cached(prefix_caching(gen.state.llm), {i: out.num_cached_tokens for i, out in enumerate(outputs)})
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
    so_far: dict[int, int] = {}  # choice -> its tokens sent
    usage = Usage(gen.prompt_tokens)
    cached: dict[int, int] = {}
    try:
        async for i, out in gen.outputs():
            cached[i] = out.num_cached_tokens
            for c in out.outputs:
                index = i * n + c.index
                # A choice's first chunk carries its prompt.
                echoed = echo is not None and index not in offsets
                if echo is not None:
                    if echo.only and not echoed:
                        continue  # the prompt alone went in the first chunk, with the finish
                    c = echo.trimmed(c)
                usage.completion_tokens += len(c.token_ids)
                so_far[index] = so_far.get(index, 0) + len(c.token_ids)
                if not echoed and not worth_sending(c, body.return_token_ids):
                    continue
                first = index not in offsets
                if echoed:
                    offsets[index] = echo.offsets(i, out)
                choice = completion_choice(
                    index,
                    c,
                    body.return_token_ids,
                    offsets.setdefault(index, TextOffsets()),
                    body.return_tokens_as_token_ids,
                )
                if echoed:
                    choice = echo.prefix(choice, i, out)
                if first and body.return_token_ids:  # vLLM's place: the choice's first chunk
                    choice["prompt_token_ids"] = out.prompt_token_ids
                mine = Usage(len(out.prompt_token_ids), so_far[index])  # vLLM: this choice's counts
                yield sse(env.body([choice], **chunk_usage(mine, include_usage, continuous)))
        if include_usage:
            yield sse(env.body([], usage=usage.cached(prefix_caching(gen.state.llm), cached).as_dict()))
    except ServeError as exc:
        yield sse(error_body(exc.status, exc.message, exc.param))
    finally:
        request.state.completion_tokens = usage.completion_tokens
    yield SSE_DONE
