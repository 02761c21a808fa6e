"""POST /v1/responses: OpenAI's Responses API as vLLM serves it without storage. The input (a text,
or messages) and the instructions become a chat, rendered and run as /v1/chat/completions runs it;
the reply is one assistant message, whole or streamed as the Responses API's typed events."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from ..engine.token_bytes import token_bytes
from .chat import chat_prompts
from .errors import RequestInvalid, ServeError
from .generation import Generation, client_request_id, request_id
from .params import request_keys, sampling_params
from .protocol import ChatRequest, ResponsesRequest
from .responses import chat_logprobs, prefix_caching, sse, worth_sending
from .sse import SSEResponse, unless_disconnected
from .state import ServerState
from .validation import explain

LOGPROBS = "message.output_text.logprobs"  # the `include` entry that asks for logprobs
# vLLM's sampling extras this request takes, passed to the chat it becomes as they are.
_EXTRAS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed",
           "logit_bias", "stop", "ignore_eos", "min_tokens", "skip_special_tokens", "user")  # fmt: skip
# Chat's fields, as this request spells them in its errors.
_PREFIXES = (("response_format.json_schema", "text.format"), ("response_format", "text.format"),
             ("max_tokens", "max_output_tokens"), ("messages", "input"))  # fmt: skip


async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    lora = state.check_model(body.model)
    _refuse_stored_state(body)
    logprobs = LOGPROBS in (body.include or ())
    chat = _as_chat(body, logprobs)
    params = sampling_params(chat, state.config.max_tokens, defaults=state.llm.generation_defaults)
    client = client_request_id(request.headers.get("x-request-id"))
    rid = "resp_" + request_id("resp", client).removeprefix("resp-")  # OpenAI's spelling
    request.state.request_id = rid
    request.state.client_request_id = client  # echoed as sent in the X-Request-Id header
    # vLLM caps max_output_tokens at the room the prompt leaves (the engine's cap), where chat refuses.
    prompts = chat_prompts(state, chat, refuse_no_room=False)
    try:
        gen = await Generation.start(state, prompts, 1, params, rid, body.stream, request_keys(chat), lora)
    except ServeError as exc:  # named in chat's fields: respelled in this request's
        mine = _respelled(exc.param)
        if mine != exc.param:
            exc.message, exc.param = exc.message.replace(exc.param, mine), mine
        raise
    request.state.prompt_tokens = gen.prompt_tokens
    request.state.timeline = gen.timeline
    reply = _Reply(rid, int(time.time()), state.reply_name(body.model, lora), body)
    if logprobs:
        reply.top, reply.raw = body.top_logprobs or 0, token_bytes(state.llm.get_tokenizer())
    if body.stream:
        return SSEResponse(_events(gen, reply, request), gen)
    return await unless_disconnected(request.receive, gen, _respond(gen, reply, request))


async def stored_response(response_id: str) -> Response:
    """GET /v1/responses/{id} (and its cancel): nothing is stored, so no id is known."""
    raise ServeError(
        f"Response with id {response_id!r} not found: this server stores no responses", "response_id", 404
    )


def _refuse_stored_state(body: ResponsesRequest) -> None:
    """What needs responses, conversations or prompt templates kept on the server: refused by name."""
    if body.previous_response_id is not None:
        raise RequestInvalid("previous_response_id: this server stores no responses", "previous_response_id")
    if body.background:
        raise RequestInvalid("background: this server stores no responses to fetch later", "background")
    if body.conversation is not None:
        raise RequestInvalid("conversation: this server stores no conversations", "conversation")
    if body.prompt is not None:
        raise RequestInvalid("prompt: prompt templates are not supported; send input", "prompt")
    if body.tools:
        raise RequestInvalid("tools: this server calls no tools on /v1/responses", "tools")


def _as_chat(body: ResponsesRequest, logprobs: bool) -> ChatRequest:
    """The chat the request amounts to: instructions as the system message, then the input."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
    else:
        for m in body.input:
            # Parts joined by newlines, as chat's messages join theirs.
            content = m.content if isinstance(m.content, str) else "\n".join(p.text for p in m.content)
            messages.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    fields: dict[str, Any] = {"model": body.model, "messages": messages, "max_tokens": body.max_output_tokens,
                              "temperature": body.temperature, "top_p": body.top_p}  # fmt: skip
    fields.update({k: getattr(body, k) for k in _EXTRAS})
    if logprobs:
        fields.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    fmt = (body.text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestInvalid("text.format: its type must be text, json_object or json_schema", "text.format")
    try:
        return ChatRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        # Located as the app's own errors are (under "body"), then named as this request names them.
        param, message = explain([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])
        raise RequestInvalid(message, _respelled(param)) from None


def _respelled(param: str | None) -> str | None:
    """A chat field's name as this request spells it."""
    if param is None:
        return None
    for chat_name, mine in _PREFIXES:
        if param == chat_name or param.startswith((chat_name + ".", chat_name + "[")):
            return mine + param[len(chat_name) :]
    return param


class _Reply:
    """The response object's fixed parts, and how a finished or running one reads."""

    def __init__(self, rid: str, created: int, model: str, body: ResponsesRequest) -> None:
        self.rid, self.item_id, self.created, self.model, self.body = (
            rid,
            f"msg_{uuid.uuid4().hex}",
            created,
            model,
            body,
        )
        self.top: int | None = None  # top_logprobs, when the request included logprobs
        self.raw: Any = None  # token bytes, for the logprobs' bytes

    def logprobs(self, c: Any) -> list[dict[str, Any]]:
        """A completion's tokens in OpenAI's logprobs shape (chat's); [] unless asked for."""
        if self.top is None:
            return []
        return (chat_logprobs(c, self.top, self.raw) or {}).get("content", [])

    def item(self, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
        content = [part] if status != "in_progress" else []
        return {
            "type": "message",
            "id": self.item_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 incomplete: str | None = None) -> dict[str, Any]:  # fmt: skip
        b = self.body
        return {
            "id": self.rid,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": usage,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "error": None,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "temperature": b.temperature,
            "top_p": b.top_p,
            "top_logprobs": b.top_logprobs,
            "text": b.text or {"format": {"type": "text"}},
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "previous_response_id": None,
            "store": False,
            "user": b.user,
            "metadata": b.metadata or {},
        }


def _usage(gen: Generation, output_tokens: int, cached: int) -> dict[str, Any]:
    cached = cached if prefix_caching(gen.state.llm) else 0
    return {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": gen.prompt_tokens + output_tokens,
    }


def _ending(finish_reason: str | None) -> tuple[str, str | None]:
    """(status, incomplete reason): a reply cut by max_output_tokens is incomplete, as OpenAI's is."""
    return ("incomplete", "max_output_tokens") if finish_reason == "length" else ("completed", None)


async def _respond(gen: Generation, reply: _Reply, request: Request) -> Response:
    (out,) = await gen.collect()
    (c,) = out.outputs
    request.state.completion_tokens = len(c.token_ids)
    status, incomplete = _ending(c.finish_reason)
    item = reply.item(c.text, "completed" if status == "completed" else "incomplete", reply.logprobs(c))
    usage = _usage(gen, len(c.token_ids), out.num_cached_tokens or 0)
    return JSONResponse(reply.response(status, [item], usage, incomplete))


async def _events(gen: Generation, reply: _Reply, request: Request) -> AsyncIterator[bytes]:
    seq = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        seq += 1
        # OpenAI's stream names each event's type on an `event:` line as well.
        return f"event: {kind}\n".encode() + sse({"type": kind, "sequence_number": seq - 1, **fields})

    where = {"item_id": reply.item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=reply.response("in_progress", []))
    yield event("response.in_progress", response=reply.response("in_progress", []))
    yield event("response.output_item.added", output_index=0, item=reply.item("", "in_progress"))
    yield event("response.content_part.added", **where, part=reply.item("", "completed")["content"][0])
    text, tokens, cached, finish, logprobs = [], 0, 0, None, []
    try:
        async for _, out in gen.outputs():
            cached = out.num_cached_tokens or 0
            for c in out.outputs:
                tokens += len(c.token_ids)
                finish = c.finish_reason or finish
                mine = reply.logprobs(c)
                logprobs += mine
                if c.text and worth_sending(c, False):
                    text.append(c.text)
                    yield event("response.output_text.delta", **where, delta=c.text, logprobs=mine)
    except ServeError as exc:
        # OpenAI's error event, then the response, failed.
        yield event("error", code=str(exc.status), message=exc.message, param=exc.param)
        failed = reply.response("failed", [], _usage(gen, tokens, cached))
        failed["error"] = {"code": "server_error", "message": exc.message}
        yield event("response.failed", response=failed)
        return
    finally:
        request.state.completion_tokens = tokens
    whole = "".join(text)
    status, incomplete = _ending(finish)
    item = reply.item(whole, "completed" if status == "completed" else "incomplete", logprobs)
    yield event("response.output_text.done", **where, text=whole, logprobs=logprobs)
    yield event("response.content_part.done", **where, part=item["content"][0])
    yield event("response.output_item.done", output_index=0, item=item)
    yield event(
        f"response.{status}", response=reply.response(status, [item], _usage(gen, tokens, cached), incomplete)
    )
