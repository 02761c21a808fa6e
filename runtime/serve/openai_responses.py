"""POST /v1/responses: OpenAI's Responses API as vLLM serves it without storage. The input (a text,
or messages, earlier function calls and their outputs) and the instructions become a chat, rendered
and run as /v1/chat/completions runs it, function tools included (tool_calls.py); the reply is its
reasoning, message and function calls as output items, whole or streamed as the API's typed events."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from ..engine.token_bytes import token_bytes
from .chat import chat_prompts, chat_run
from .chat_reply import ReplyShape
from .errors import RequestInvalid, ServeError
from .generation import Generation, client_request_id, request_id
from .protocol import (
    ChatRequest,
    ResponseFunctionCall,
    ResponseFunctionCallOutput,
    ResponseReasoning,
    ResponsesRequest,
)
from .reasoning import reasoning_tokens
from .responses import chat_logprobs, prefix_caching, sse, worth_sending
from .sse import SSEResponse, unless_disconnected
from .state import ServerState
from .validation import explain

LOGPROBS = "message.output_text.logprobs"  # the `include` entry that asks for logprobs
# vLLM's sampling extras this request takes, passed to the chat it becomes as they are.
_EXTRAS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed",
           "logit_bias", "stop", "ignore_eos", "min_tokens", "skip_special_tokens", "user",
           "cache_salt")  # fmt: skip
# Chat's fields, as this request spells them in its errors.
_PREFIXES = (("response_format.json_schema", "text.format"), ("response_format", "text.format"),
             ("max_tokens", "max_output_tokens"), ("messages", "input"))  # fmt: skip


async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state: ServerState = request.app.state.fastpath
    lora = state.check_model(body.model)
    _refuse_stored_state(body)
    logprobs = LOGPROBS in (body.include or ())
    chat = _as_chat(body, logprobs)
    client = client_request_id(request.headers.get("x-request-id"))
    rid = "resp_" + request_id("resp", client).removeprefix("resp-")  # OpenAI's spelling
    request.state.request_id = rid
    request.state.client_request_id = client  # echoed as sent in the X-Request-Id header
    # vLLM caps max_output_tokens at the room the prompt leaves (the engine's cap), where chat refuses.
    prompts = chat_prompts(state, chat, refuse_no_room=False)
    try:
        run = chat_run(state, chat)
        gen = await Generation.start(
            state, run.judging(state, prompts), 1, run.params, rid, body.stream, run.keys, lora
        )
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
    shape = run.reply_shape()
    if body.stream:
        events = _events(gen, reply, request) if shape.plain else _shaped_events(gen, reply, request, shape)
        return SSEResponse(events, gen)
    return await unless_disconnected(request.receive, gen, _respond(gen, reply, request, shape))


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


def _as_chat(body: ResponsesRequest, logprobs: bool) -> ChatRequest:
    """The chat the request amounts to: instructions as the system message, then the input."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
    else:
        for m in body.input:
            if isinstance(m, ResponseReasoning):
                continue  # templates leave earlier turns' thinking out of the prompt
            if isinstance(m, ResponseFunctionCall):
                call = {
                    "id": m.call_id,
                    "type": "function",
                    "function": {"name": m.name, "arguments": m.arguments},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    # a reply's text and its calls, or calls made together: one assistant turn, as generated
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif isinstance(m, ResponseFunctionCallOutput):
                messages.append({"role": "tool", "tool_call_id": m.call_id, "content": _text(m.output)})
            else:
                role = "system" if m.role == "developer" else m.role
                messages.append({"role": role, "content": _text(m.content)})
    fields: dict[str, Any] = {"model": body.model, "messages": messages, "max_tokens": body.max_output_tokens,
                              "temperature": body.temperature, "top_p": body.top_p,
                              "parallel_tool_calls": body.parallel_tool_calls}  # fmt: skip
    if body.tools:
        fields["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                           for t in body.tools]  # fmt: skip
    choice = body.tool_choice
    if choice is not None:
        fields["tool_choice"] = (
            choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        )
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


def _text(content: str | list[Any]) -> str:
    # Parts joined by newlines, as chat's messages join theirs.
    return content if isinstance(content, str) else "\n".join(p.text for p in content)


def _respelled(param: str | None) -> str | None:
    """A chat field's name as this request spells it."""
    if param is None:
        return None
    if param.startswith(("tools.", "tool_choice.")):  # chat's tools nest under "function"; these do not
        return param.replace(".function", "", 1)
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

    def items(
        self, message: dict[str, Any], status: str, logprobs: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The output items of a reply ReplyShape read: its reasoning, its message (when it has text, or
        nothing else), then its function calls."""
        out, calls, reasoning = [], message.get("tool_calls") or [], message.get("reasoning")
        if reasoning:
            out.append(reasoning_item(f"rs_{uuid.uuid4().hex}", reasoning, "completed"))
        if message.get("content") or not (calls or reasoning):
            out.append(self.item(message.get("content") or "", "completed", logprobs))
        out += [call_item(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
        return _last_is(out, status)

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
            "tools": [t.model_dump(exclude_none=True) for t in b.tools or ()],
            "tool_choice": b.tool_choice.model_dump()
            if isinstance(b.tool_choice, BaseModel)
            else b.tool_choice or "auto",
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": None,
            "store": False,
            "user": b.user,
            "metadata": b.metadata or {},
        }


def _usage(gen: Generation, output_tokens: int, cached: int, reasoning: int = 0) -> dict[str, Any]:
    cached = cached if prefix_caching(gen.state.llm) else 0
    return {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": gen.prompt_tokens + output_tokens,
    }


def _ending(finish_reason: str | None) -> tuple[str, str | None]:
    """(status, incomplete reason): a reply cut by max_output_tokens is incomplete, as OpenAI's is."""
    return ("incomplete", "max_output_tokens") if finish_reason == "length" else ("completed", None)


def _last_is(items: list[dict[str, Any]], status: str) -> list[dict[str, Any]]:
    """A reply cut by max_output_tokens was cut in its last item: that one is incomplete, as the
    response is; the ones before it were finished."""
    if items:
        items[-1]["status"] = status
    return items


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id.removeprefix('call_')}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


async def _respond(gen: Generation, reply: _Reply, request: Request, shape: ReplyShape) -> Response:
    (out,) = await gen.collect()
    (c,) = out.outputs
    request.state.completion_tokens = len(c.token_ids)
    status, incomplete = _ending(c.finish_reason)
    done = "completed" if status == "completed" else "incomplete"
    if shape.plain:
        items = [reply.item(c.text, done, reply.logprobs(c))]
    else:
        items = reply.items(shape.message(c.text, c.finish_reason)[0], done, reply.logprobs(c))
    thought = _thought(gen, shape, c.token_ids, c.text)
    usage = _usage(gen, len(c.token_ids), out.num_cached_tokens or 0, thought)
    return JSONResponse(reply.response(status, items, usage, incomplete))


def _thought(gen: Generation, shape: ReplyShape, token_ids, text: str) -> int:
    """The reply's reasoning tokens: none unless the server splits reasoning and this reply was split."""
    if shape.reasoning is None:
        return 0
    return reasoning_tokens(shape.reasoning, gen.state.llm.get_tokenizer(), token_ids, text)


class _Numbered:
    """A stream's events, numbered in the order sent."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        self.sent += 1
        # OpenAI's stream names each event's type on an `event:` line as well.
        return f"event: {kind}\n".encode() + sse({"type": kind, "sequence_number": self.sent - 1, **fields})

    def failed(self, exc: ServeError, reply: _Reply, usage: dict[str, Any]) -> list[bytes]:
        """OpenAI's error event, then the response, failed."""
        response = reply.response("failed", [], usage)
        response["error"] = {"code": "server_error", "message": exc.message}
        return [self("error", code=str(exc.status), message=exc.message, param=exc.param),
                self("response.failed", response=response)]  # fmt: skip


async def _events(gen: Generation, reply: _Reply, request: Request) -> AsyncIterator[bytes]:
    event = _Numbered()
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
        for e in event.failed(exc, reply, _usage(gen, tokens, cached)):
            yield e
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


async def _shaped_events(
    gen: Generation, reply: _Reply, request: Request, shape: ReplyShape
) -> AsyncIterator[bytes]:
    """The stream of a reply read as ReplyShape reads it: an output item opens when its first piece
    comes (reasoning, then the message, then each function call) and closes when the next opens or
    the reply ends; a call's arguments go out as they come."""
    event = _Numbered()

    items: list[dict[str, Any]] = []  # as they will read when done
    texts: dict[int, str] = {}  # an open reasoning or message item's text so far, by output index
    open_at: int | None = None  # the reasoning or message item taking text
    calls: dict[int, int] = {}  # a call's index in the reply -> its output index
    stream, logprobs = shape.stream(), []

    def close_text(status: str = "completed"):
        nonlocal open_at
        if open_at is None:
            return
        at, item = open_at, items[open_at]
        where = {"item_id": item["id"], "output_index": at, "content_index": 0}
        if item["type"] == "reasoning":
            items[at] = reasoning_item(item["id"], texts[at], status)
            yield event("response.reasoning_text.done", **where, text=texts[at])
            yield event("response.content_part.done", **where, part=items[at]["content"][0])
        else:
            items[at] = {**reply.item(texts[at], status, logprobs), "id": item["id"]}
            yield event("response.output_text.done", **where, text=texts[at], logprobs=logprobs)
            yield event("response.content_part.done", **where, part=items[at]["content"][0])
        yield event("response.output_item.done", output_index=at, item=items[at])
        open_at = None

    def text_delta(kind: str, delta: str, mine: list[dict[str, Any]]):
        nonlocal open_at
        if open_at is None or items[open_at]["type"] != kind:
            yield from close_text()
            open_at = len(items)
            if kind == "reasoning":
                items.append(reasoning_item(f"rs_{uuid.uuid4().hex}", "", "in_progress"))
            else:
                items.append({**reply.item("", "in_progress"), "id": f"msg_{uuid.uuid4().hex}"})
            texts[open_at] = ""
            yield event("response.output_item.added", output_index=open_at, item=items[open_at])
            # each item's one content part: the message's text or the reasoning's
            part = (
                reply.item("", "completed")["content"][0]
                if kind == "message"
                else {"type": "reasoning_text", "text": ""}
            )
            yield event("response.content_part.added", item_id=items[open_at]["id"], output_index=open_at,
                        content_index=0, part=part)  # fmt: skip
        texts[open_at] += delta
        where = {"item_id": items[open_at]["id"], "output_index": open_at, "content_index": 0}
        if not delta:
            return
        if kind == "reasoning":
            yield event("response.reasoning_text.delta", **where, delta=delta)
        else:
            yield event("response.output_text.delta", **where, delta=delta, logprobs=mine)

    yield event("response.created", response=reply.response("in_progress", []))
    yield event("response.in_progress", response=reply.response("in_progress", []))
    tokens, cached, finish, held = 0, 0, None, []
    ids, whole = [], []  # the reply's tokens and text, for its reasoning tokens
    try:
        async for _, out in gen.outputs():
            cached = out.num_cached_tokens or 0
            for c in out.outputs:
                tokens += len(c.token_ids)
                ids += c.token_ids
                whole.append(c.text)
                finish = c.finish_reason or finish
                delta = stream.feed(c.text, c.finish_reason is not None)
                held += reply.logprobs(c)  # a chunk held back sends its logprobs with the text after it
                if delta.get("reasoning"):
                    for e in text_delta("reasoning", delta["reasoning"], []):
                        yield e
                    if not delta.get("content"):
                        held = []  # reasoning tokens: no logprobs field takes them
                if delta.get("content"):
                    mine, held = held, []
                    logprobs += mine
                    for e in text_delta("message", delta["content"], mine):
                        yield e
                for d in delta.get("tool_calls", ()):
                    for e in close_text():
                        yield e
                    if "id" in d:
                        calls[d["index"]] = len(items)
                        items.append(call_item(d["id"], d["function"]["name"], "", "in_progress"))
                        yield event("response.output_item.added", output_index=len(items) - 1, item=items[-1])
                    at = calls[d["index"]]
                    if d["function"].get("arguments"):
                        items[at]["arguments"] += d["function"]["arguments"]
                        yield event("response.function_call_arguments.delta", item_id=items[at]["id"],
                                    output_index=at, delta=d["function"]["arguments"])  # fmt: skip
    except ServeError as exc:
        for e in event.failed(exc, reply, _usage(gen, tokens, cached)):
            yield e
        return
    finally:
        request.state.completion_tokens = tokens
    status, incomplete = _ending(finish)
    done = "completed" if status == "completed" else "incomplete"
    if not items:  # nothing came: an empty message, as a plain reply has
        for e in text_delta("message", "", []):
            yield e
    for e in close_text("completed" if calls else done):
        yield e
    for at in calls.values():
        items[at]["status"] = done if at == len(items) - 1 else "completed"
        yield event("response.function_call_arguments.done", item_id=items[at]["id"], output_index=at,
                    arguments=items[at]["arguments"])  # fmt: skip
        yield event("response.output_item.done", output_index=at, item=items[at])
    usage = _usage(gen, tokens, cached, _thought(gen, shape, ids, "".join(whole)))
    yield event(f"response.{status}", response=reply.response(status, items, usage, incomplete))
