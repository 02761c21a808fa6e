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

from .chat import chat_prompts
from .errors import RequestInvalid, ServeError, error_body
from .generation import Generation, client_request_id, request_id
from .params import request_keys, sampling_params
from .protocol import ChatRequest, ResponsesRequest
from .responses import prefix_caching, sse, worth_sending
from .sse import SSEResponse, unless_disconnected
from .state import ServerState
from .validation import explain

# Chat's fields that errors name, as this request spells them.
_FIELDS = {"max_tokens": "max_output_tokens", "response_format": "text", "messages": "input"}


async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    lora = state.check_model(body.model)
    if body.previous_response_id is not None:
        raise RequestInvalid("previous_response_id: this server stores no responses", "previous_response_id")
    if body.tools:
        raise RequestInvalid("tools: this server calls no tools on /v1/responses", "tools")
    chat = _as_chat(body)
    params = sampling_params(chat, state.config.max_tokens, defaults=state.llm.generation_defaults)
    client = client_request_id(request.headers.get("x-request-id"))
    rid = request_id("resp", client)
    request.state.request_id = rid
    request.state.client_request_id = client  # echoed as sent in the X-Request-Id header
    try:
        gen = await Generation.start(
            state, chat_prompts(state, chat), 1, params, rid, body.stream, request_keys(chat), lora
        )
    except ServeError as exc:  # named in chat's fields: respelled in this request's
        if exc.param in _FIELDS:
            exc.message = exc.message.replace(exc.param, _FIELDS[exc.param])
            exc.param = _FIELDS[exc.param]
        raise
    request.state.prompt_tokens = gen.prompt_tokens
    request.state.timeline = gen.timeline
    reply = _Reply(rid, f"msg_{uuid.uuid4().hex}", int(time.time()), state.reply_name(body.model, lora), body)
    if body.stream:
        return SSEResponse(_events(gen, reply, request), gen)
    return await unless_disconnected(request.receive, gen, _respond(gen, reply, request))


def _as_chat(body: ResponsesRequest) -> ChatRequest:
    """The chat the request amounts to: instructions as the system message, then the input."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
    else:
        for m in body.input:
            content = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)
            messages.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    fields: dict[str, Any] = {"model": body.model, "messages": messages, "max_tokens": body.max_output_tokens,
                              "temperature": body.temperature, "top_p": body.top_p}  # fmt: skip
    fmt = (body.text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestInvalid("text.format: its type must be text, json_object or json_schema", "text")
    try:
        return ChatRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        param, message = explain(exc.errors())
        param = _FIELDS.get(param, param)
        raise RequestInvalid(message, param) from None


class _Reply:
    """The response object's fixed parts, and how a finished or running one reads."""

    def __init__(self, rid: str, item_id: str, created: int, model: str, body: ResponsesRequest) -> None:
        self.rid, self.item_id, self.created, self.model, self.body = rid, item_id, created, model, body

    def item(self, text: str, status: str) -> dict[str, Any]:
        content = (
            [{"type": "output_text", "text": text, "annotations": []}] if status != "in_progress" else []
        )
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
            "text": b.text or {"format": {"type": "text"}},
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "previous_response_id": None,
            "store": False,
            "metadata": b.metadata or {},
        }


def _usage(gen: Generation, output_tokens: int, cached: int) -> dict[str, Any]:
    cached = cached if prefix_caching(gen.state.llm) else 0
    return {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached},
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
    item = reply.item(c.text, "completed" if status == "completed" else "incomplete")
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
    part = {"type": "output_text", "text": "", "annotations": []}
    yield event("response.content_part.added", **where, part=part)
    text, tokens, cached, finish = [], 0, 0, None
    try:
        async for _, out in gen.outputs():
            cached = out.num_cached_tokens or 0
            for c in out.outputs:
                tokens += len(c.token_ids)
                finish = c.finish_reason or finish
                if c.text and worth_sending(c, False):
                    text.append(c.text)
                    yield event("response.output_text.delta", **where, delta=c.text, logprobs=[])
    except ServeError as exc:
        yield sse(error_body(exc.status, exc.message, exc.param))
        return
    request.state.completion_tokens = tokens
    whole = "".join(text)
    status, incomplete = _ending(finish)
    item = reply.item(whole, "completed" if status == "completed" else "incomplete")
    yield event("response.output_text.done", **where, text=whole, logprobs=[])
    yield event("response.content_part.done", **where, part={**part, "text": whole})
    yield event("response.output_item.done", output_index=0, item=item)
    final = reply.response(status, [item], _usage(gen, tokens, cached), incomplete)
    yield event(f"response.{status}", response=final)
