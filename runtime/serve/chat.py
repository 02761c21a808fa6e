"""POST /v1/chat/completions: messages rendered by the tokenizer's chat template, streamed or not."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..engine.admission import reasoning_gate, salted
from ..engine.sampling_params import GuidedDecodingParams, SamplingParams
from ..engine.token_bytes import token_bytes
from . import reasoning, tool_calls
from .beam import BeamGeneration, beam_params
from .chat_reply import ReplyShape, ReplyStream
from .errors import RequestInvalid, ServeError, error_body
from .generation import Generation, client_request_id, request_id
from .params import RequestKeys, check_room, request_keys, sampling_params
from .protocol import ChatRequest
from .responses import (
    SSE_DONE,
    Envelope,
    TokenBytes,
    Usage,
    chat_choice,
    chat_delta,
    chunk_usage,
    prefix_caching,
    sse,
    vllm_prompt_logprobs,
    worth_sending,
)
from .sse import SSEResponse, unless_disconnected
from .state import ServerState
from .tool_calls import ToolPlan


def chat_prompts(
    state: ServerState, body: ChatRequest, refuse_no_room: bool = True
) -> Callable[[], list[Any]]:
    """The request's one prompt, its messages rendered by the chat template: rendered when called (in
    the worker thread that submits it), the template's own errors a 400 naming `messages`. An explicit
    max_tokens the context cannot hold after the prompt is a 400 unless not `refuse_no_room` (the
    engine then caps it, as vLLM's /v1/responses does)."""
    messages = body.template_messages()

    def prompts() -> list[Any]:
        try:
            prompt = state.llm.render_chat(
                messages,
                body.chat_template,
                body.add_generation_prompt,
                body.continue_final_message,
                body.chat_template_kwargs,
                body.template_tools(),
            )
        except Exception as exc:  # the template's own error (raise_exception, a bad role order) names it
            raise RequestInvalid(f"messages: the chat template failed: {exc}", "messages") from None
        if body.add_special_tokens:  # vLLM's: the tokenizer's own BOS as well as the template's
            ids = state.llm.get_tokenizer()(prompt["prompt"], add_special_tokens=True)["input_ids"]
            prompt = {**prompt, "prompt_token_ids": list(ids)}
        if refuse_no_room:
            check_room(len(prompt["prompt_token_ids"]), body, state.llm.config.max_seq_len)
        return [salted(prompt, body.cache_salt)]

    return prompts


async def create_chat_completion(body: ChatRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    if body.return_tokens_as_token_ids is None:  # the request's own choice, else the server's
        body = body.model_copy(update={"return_tokens_as_token_ids": state.config.return_tokens_as_token_ids})
    lora = state.check_model(body.model)
    state.check_chat_template(body.chat_template)
    run = chat_run(state, body)
    if run.shape.tools.mode != "none" and body.use_beam_search:
        raise RequestInvalid("use_beam_search: tool calls are not made with beam search", "use_beam_search")
    params = run.params
    prompts = run.judging(state, chat_prompts(state, body))

    client = client_request_id(request.headers.get("x-request-id"))
    rid = request_id("chatcmpl", client)
    request.state.request_id = rid
    request.state.client_request_id = client  # echoed as sent in the X-Request-Id header
    keys = run.keys
    if body.use_beam_search:
        top = (body.top_logprobs or 0) if body.logprobs else None
        beam, truncate = beam_params(body, params, top), params.truncate_prompt_tokens
        gen = await BeamGeneration.begin(
            state, prompts, 1, beam, top, rid, body.stream, keys, truncate, lora, body.cache_salt
        )
    else:
        gen = await Generation.start(state, prompts, 1, params, rid, body.stream, keys, lora)
    request.state.prompt_tokens = gen.prompt_tokens
    request.state.timeline = gen.timeline
    shape = run.reply_shape()
    if body.stream:
        env = Envelope(rid, "chat.completion.chunk", int(time.time()), state.reply_name(body.model, lora))
        return SSEResponse(_events(gen, env, body, request, shape), gen)
    env = Envelope(rid, "chat.completion", int(time.time()), state.reply_name(body.model, lora))
    return await unless_disconnected(request.receive, gen, _respond(gen, env, body, request, shape))


async def _respond(gen: Generation, env: Envelope, body: ChatRequest, request: Request, shape: ReplyShape):
    (out,) = await gen.collect()
    usage = Usage(gen.prompt_tokens, sum(len(c.token_ids) for c in out.outputs))
    usage.cached(prefix_caching(gen.state.llm), {0: out.num_cached_tokens})
    request.state.completion_tokens = usage.completion_tokens
    raw = _raw(gen)
    choices = []
    role = reply_role(body, gen.state.config.response_role)
    as_ids, echoed = body.return_tokens_as_token_ids, echoed_text(body, role)
    for c in out.outputs:
        choice = chat_choice(c.index, c, body.return_token_ids, raw, body.top_logprobs or 0, as_ids)
        if not shape.plain:
            choice["message"], choice["finish_reason"] = shape.message(c.text, c.finish_reason)
        choice["message"]["role"] = role
        if echoed:
            choice["message"]["content"] = echoed + (choice["message"]["content"] or "")
        choices.append(choice)
    extra: dict[str, Any] = {"prompt_token_ids": out.prompt_token_ids} if body.return_token_ids else {}
    if body.prompt_logprobs is not None:  # vLLM's place: beside the choices
        extra["prompt_logprobs"] = vllm_prompt_logprobs(
            out.prompt_token_ids, out.prompt_logprobs, body.prompt_logprobs
        )
    return JSONResponse(env.body(choices, usage=usage.as_dict(), **extra))


def reply_role(body: ChatRequest, response_role: str) -> str:
    """vLLM's: the server's response role after a generation prompt; without one the reply continues
    the last message, and carries its role."""
    return response_role if body.add_generation_prompt else body.messages[-1].role


def echoed_text(body: ChatRequest, role: str) -> str:
    """What vLLM's chat `echo` puts before the reply: the last message's text, where that message has
    the reply's role."""
    if not body.echo:
        return ""
    last = body.messages[-1]
    return (last.as_template_dict()["content"] or "") if last.role == role else ""


async def _events(
    gen: Generation, env: Envelope, body: ChatRequest, request: Request, shape: ReplyShape
) -> AsyncIterator[bytes]:
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    continuous = include_usage and body.stream_options.continuous_usage_stats
    so_far: dict[int, int] = {}  # choice -> its tokens so far
    usage = Usage(gen.prompt_tokens)
    raw = _raw(gen)
    try:
        # Each choice opens with its role alone, before any token (as OpenAI and vLLM send it), then
        # an echo's text in a chunk of its own (as vLLM sends it).
        role = reply_role(body, gen.state.config.response_role)
        echoed = echoed_text(body, role)
        opened = chunk_usage(Usage(gen.prompt_tokens), include_usage, continuous)
        for index in range(body.n):
            opening = {
                "index": index,
                "delta": {"role": role, "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            yield sse(env.body([opening], **opened))
            if echoed:
                echo = {"index": index, "delta": {"content": echoed}, "logprobs": None, "finish_reason": None}
                yield sse(env.body([echo], **opened))
        cached: dict[int, int] = {}
        streams = {i: shape.stream() for i in range(body.n)}
        async for _, out in gen.outputs():
            cached[0] = out.num_cached_tokens
            for c in out.outputs:
                usage.completion_tokens += len(c.token_ids)
                so_far[c.index] = so_far.get(c.index, 0) + len(c.token_ids)
                if not shape.plain:
                    delta = _shaped_delta(streams[c.index], c, body, raw)
                    if delta is None:
                        continue
                elif not worth_sending(c, body.return_token_ids):
                    continue
                else:
                    delta = chat_delta(
                        c.index,
                        c,
                        body.return_token_ids,
                        raw,
                        body.top_logprobs or 0,
                        body.return_tokens_as_token_ids,
                    )
                mine = Usage(gen.prompt_tokens, so_far[c.index])  # vLLM: this choice's counts
                yield sse(env.body([delta], **chunk_usage(mine, include_usage, continuous)))
        if include_usage:
            yield sse(env.body([], usage=usage.cached(prefix_caching(gen.state.llm), cached).as_dict()))
    except ServeError as exc:
        yield sse(error_body(exc.status, exc.message, exc.param))
    finally:
        request.state.completion_tokens = usage.completion_tokens
    yield SSE_DONE


def _shaped_delta(stream: ReplyStream, c, body: ChatRequest, raw: TokenBytes | None) -> dict[str, Any] | None:
    """A choice's chunk where its text is read (reasoning, tool calls): what the stream gives for this
    piece, its finish_reason "tool_calls" where the model called; None: nothing to send yet."""
    delta = stream.feed(c.text, c.finish_reason is not None)
    top, as_ids = body.top_logprobs or 0, body.return_tokens_as_token_ids
    choice = chat_delta(c.index, c, body.return_token_ids, raw, top, as_ids)
    choice["delta"] = delta
    choice["finish_reason"] = stream.finish_reason(c.finish_reason)
    wanted = c.token_ids and (body.return_token_ids or c.logprobs)
    return choice if delta or c.finish_reason or wanted else None


@dataclass(frozen=True, slots=True)
class ChatRun:
    """What a chat runs with: its sampling, the keys its engine errors blame, how its reply is read."""

    params: SamplingParams
    keys: RequestKeys
    shape: ReplyShape
    # Set by `judging` once the prompt is rendered: it already closed the thinking (a template that turned
    # it off), so the grammar holds the reply from its first token and nothing is to be split off.
    closed: list[bool] = dataclasses.field(default_factory=lambda: [False])

    def judging(self, state: ServerState, prompts: Callable[[], list[Any]]) -> Callable[[], list[Any]]:
        """`prompts`, which also judges the rendered prompt where the grammar waits for the thinking's end
        (the engine's own rule, admission.reasoning_gate)."""
        guided = self.params.guided or {}
        markers = guided.get("after_reasoning")
        if not markers:
            return prompts

        def judged() -> list[Any]:
            rendered = prompts()
            ids = rendered[0].get("prompt_token_ids") or []
            self.closed[0] = reasoning_gate(tuple(markers), list(ids), state.llm.get_tokenizer()) is None
            return rendered

        return judged

    def reply_shape(self) -> ReplyShape:
        """How the reply is read, once `judging` has run (before the engine's first output)."""
        return dataclasses.replace(self.shape, reasoning=None) if self.closed[0] else self.shape


def chat_run(state: ServerState, body: ChatRequest) -> ChatRun:
    """A chat's tools planned (tool_calls.plan), its SamplingParams held to their schema, and its reply's
    reader; shared by /v1/chat/completions and /v1/responses. RequestInvalid names the chat's field."""
    tools = tool_calls.plan(body, state.config.auto_tool_parser)
    params = sampling_params(
        body, state.config.max_tokens, defaults=state.llm.generation_defaults, tool_schema=tools.schema
    )
    params = _keep_call_tags(state, tools, params)
    params, thinking = _after_reasoning(state, params)
    return ChatRun(
        params, request_keys(body, tools.schema), ReplyShape(tools, thinking, body.include_reasoning)
    )


def _after_reasoning(state: ServerState, params: SamplingParams) -> tuple[SamplingParams, str | None]:
    """(params, the reasoning parser that reads the reply). Under --reasoning-parser a grammar (a
    response_format, a named or required tool) holds the reply from the token after `</think>`, the
    thinking free before it, as vLLM applies structured outputs after the reasoning; where `</think>`
    is not one token of the tokenizer, the grammar holds the reply from its first token, which is then
    all answer."""
    parser = state.config.reasoning_parser
    guided = params.guided_decoding
    if parser is None or guided is None:
        return params, parser
    tokenizer = state.llm.get_tokenizer()
    if tokenizer is None or len(tokenizer.encode(reasoning.CLOSE, add_special_tokens=False)) != 1:
        return params, None
    if isinstance(guided, dict):
        guided = GuidedDecodingParams(**guided)
    guided = dataclasses.replace(guided, after_reasoning=(reasoning.OPEN, reasoning.CLOSE))
    return dataclasses.replace(params, guided_decoding=guided, guided=None), parser


def _keep_call_tags(state: ServerState, tools: ToolPlan, params: SamplingParams) -> SamplingParams:
    """`params` with special tokens kept in the text where the tokenizer marks hermes' call tags special
    (Hermes 2 Pro's): skipping them would hide the calls from the parser."""
    tokenizer = state.llm.get_tokenizer()
    special = getattr(tokenizer, "all_special_tokens", ()) if tokenizer is not None else ()
    if tools.parser == "hermes" and "<tool_call>" in special:
        return dataclasses.replace(params, skip_special_tokens=False)
    return params


def _raw(gen: Generation) -> TokenBytes | None:
    tokenizer = gen.state.llm.get_tokenizer()
    return token_bytes(tokenizer) if tokenizer is not None else None
