"""Tool calls on /v1/chat/completions, as vLLM makes them.

- A named tool (`tool_choice: {"type": "function", ...}`) and `"required"` hold the output to a JSON
  schema through guided decoding: the tool's parameters, or a list of calls to the given tools. Any
  model then gives a call that parses (not necessarily a good one).
- `"auto"` lets the model write freely and reads the calls out of its text with a parser for the
  model's format, chosen when the server starts (`--enable-auto-tool-choice --tool-call-parser`):
  `hermes` (Hermes, Qwen2.5/3: `<tool_call>{...}</tool_call>`), `llama3_json` (Llama 3.1/3.2:
  `{"name": ..., "parameters": {...}}`, several joined by `;`) or `pythonic` (Llama 3.2's and Llama 4's
  pythonic templates: `[get_weather(city="Oslo"), now()]`, read with `ast`, never run;
  `llama4_pythonic`, vLLM's name for it with Llama 4, is the same parser).
- `"none"`, or no tools: the tools reach the chat template only.

A call's finish_reason is "tool_calls" where the model chose to call (auto, required), and the
engine's where the request named the tool, as OpenAI reports them.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from fastpath.vocab import TOOL_CALL_PARSERS as PARSERS

from .errors import RequestInvalid
from .protocol import ChatRequest, NamedToolChoice

Mode = Literal["none", "named", "required", "auto"]

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
# What a model writes is read as strict JSON: NaN or Infinity would reach the client as arguments no
# JSON parser takes, and nesting deep enough to exhaust the stack is no call either.
_BAD_JSON = (ValueError, RecursionError)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)
_HERMES_CALL = re.compile(re.escape(_HERMES_OPEN) + r"(.*?)(?:" + re.escape(_HERMES_CLOSE) + r"|$)", re.S)
_PYTHON_TAG = "<|python_tag|>"
_PYTHON_START, _PYTHON_END = "<|python_start|>", "<|python_end|>"  # Llama 4 around pythonic calls
# What a reply that calls starts with, after whitespace, where its calls must come first.
_LEADS = {"llama3_json": ("{", _PYTHON_TAG), "pythonic": ("[", _PYTHON_START)}
_ALIASES = {"llama4_pythonic": "pythonic"}  # vLLM's other names for a parser here


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools ask of its generation and of reading its output."""

    mode: Mode = "none"
    name: str | None = None  # the named tool
    parser: str | None = None  # auto's
    parallel: bool = True  # more than one call in a reply
    schema: dict[str, Any] | None = None  # what guided decoding holds the output to (named, required)

    def finish_reason(self, engine_reason: str | None, calls: list[ToolCall]) -> str | None:
        if calls and self.mode in ("auto", "required") and engine_reason == "stop":
            return "tool_calls"
        return engine_reason

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole reply. Text that does not parse as calls stays content: a
        reply cut at max_tokens, or an auto reply that calls nothing."""
        if self.mode == "named":
            assert self.name is not None
            return None, [ToolCall(self.name, text)]
        if self.mode == "required":
            calls = _required_calls(text)
            return (None, calls) if calls else (text, [])
        if self.mode == "auto":
            content, calls = parse(self.parser or "", text)
            return content, calls if self.parallel else calls[:1]
        return text, []


def plan(body: ChatRequest, auto_parser: str | None) -> ToolPlan:
    """The request's ToolPlan. `auto_parser`: the server's --tool-call-parser when it was started with
    --enable-auto-tool-choice, else None, and then "auto" (also OpenAI's default when there are tools)
    is a 400, as in vLLM."""
    choice, tools = body.tool_choice, body.tools or []
    parallel = body.parallel_tool_calls is not False
    if not tools or choice == "none":
        return ToolPlan()
    if isinstance(choice, NamedToolChoice):
        tool = next(
            t for t in tools if t.function.name == choice.function.name
        )  # the body checked it is there
        return ToolPlan(
            "named", tool.function.name, parallel=parallel, schema=_parameters(tool.function.parameters)
        )
    if choice == "required":
        return ToolPlan("required", parallel=parallel, schema=_required_schema(body, parallel))
    if auto_parser is None:
        said = (
            "tool_choice 'auto'"
            if choice == "auto"
            else "tools without a tool_choice (OpenAI's default is 'auto')"
        )
        raise RequestInvalid(
            f"tool_choice: {said} needs the server started with --enable-auto-tool-choice and "
            "--tool-call-parser; 'required' or a named tool work without them, and 'none' renders the "
            "tools into the prompt only",
            "tool_choice",
        )
    return ToolPlan("auto", parser=auto_parser, parallel=parallel)


def _parameters(parameters: dict[str, Any] | None) -> dict[str, Any]:
    return parameters if parameters else {"type": "object", "properties": {}}


def _required_schema(body: ChatRequest, parallel: bool) -> dict[str, Any]:
    """A list of one or more calls, each the name of one of the tools and arguments to its schema.
    Each tool's definitions ($defs, definitions) move to the list's root, where its "#/$defs/..."
    references point once its schema sits inside the list's (as vLLM moves them); two tools defining
    one name differently are a 400."""
    calls, shared = [], {"$defs": {}, "definitions": {}}
    for i, tool in enumerate(body.tools or []):
        parameters = dict(_parameters(tool.function.parameters))
        for key, found in shared.items():
            defs = parameters.get(key)
            if not isinstance(defs, dict):
                continue  # none, or not a definitions table: left for the schema compiler to judge
            del parameters[key]
            for name, definition in defs.items():
                if found.setdefault(name, definition) != definition:
                    raise RequestInvalid(
                        f"tools[{i}].function.parameters: {key} {name!r} differs from another tool's; "
                        "tool_choice 'required' puts every tool's definitions in one schema",
                        "tools",
                    )
        calls.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    schema.update({key: found for key, found in shared.items() if found})
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _required_calls(text: str) -> list[ToolCall]:
    try:
        value = _DECODER.decode(text)
    except _BAD_JSON:
        return []
    if not isinstance(value, list):
        return []
    calls = [_call(item, "parameters") for item in value]
    return [c for c in calls if c is not None] if all(calls) else []


def _call(item: Any, *argument_keys: str) -> ToolCall | None:
    """{"name": ..., <argument key>: {...}} -> a ToolCall; None when it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments: Any = {}
    for key in argument_keys:
        if key in item:
            arguments = item[key]
            break
    if isinstance(arguments, str):  # already JSON text (some models write it so)
        return ToolCall(item["name"], arguments)
    try:
        return ToolCall(item["name"], _json_text(arguments))
    except _BAD_JSON:
        return None


def _json_text(value: Any) -> str:
    """JSON text a response can carry: no NaN, and UTF-8 (a lone surrogate such as "\\ud800" is not:
    UnicodeEncodeError, a ValueError)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")
    return text


def parse(parser: str, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a free reply in `parser`'s format. A reply whose calls do not all parse is
    content, whole: half a call is no call."""
    parser = _ALIASES.get(parser, parser)
    if parser == "hermes":
        return _parse_hermes(text)
    if parser == "llama3_json":
        return _parse_llama3_json(text)
    if parser == "pythonic":
        return _parse_pythonic(text)
    raise ValueError(f"unknown tool-call parser {parser!r}; known: {', '.join(PARSERS)}")


def _parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    start = text.find(_HERMES_OPEN)
    if start < 0:
        return text, []
    calls = []
    for match in _HERMES_CALL.finditer(text, start):
        body = match.group(1)
        if match.end() == len(text) and not text.endswith(_HERMES_CLOSE):  # cut before its close
            body = body[: len(body) - held_back(body, _HERMES_CLOSE)]  # "...}\n</tool_c" ends "...}"
        try:
            call = _call(_DECODER.decode(body.strip()), "arguments", "parameters")
        except _BAD_JSON:
            return text, []
        if call is None:
            return text, []
        calls.append(call)
    content = text[:start]  # as a stream sends it, unstripped
    return content if content.strip() else None, calls


def _parse_llama3_json(text: str) -> tuple[str | None, list[ToolCall]]:
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].lstrip()
    if not body.startswith("{"):
        return text, []
    calls, at = [], 0
    while at < len(body):
        try:
            item, at = _DECODER.raw_decode(body, at)
            call = _call(item, "parameters", "arguments")
        except _BAD_JSON:
            return text, []
        if call is None:
            return text, []
        calls.append(call)
        rest = body[at:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        elif rest:
            return text, []
        at = len(body) - len(rest)
    return None, calls


def _parse_pythonic(text: str) -> tuple[str | None, list[ToolCall]]:
    """A Python list of calls with keyword arguments whose values are literals: parsed, never evaluated."""
    body = text.strip()
    if body.startswith(_PYTHON_START):
        body = body[len(_PYTHON_START) :].removesuffix(_PYTHON_END).strip()
    if not (body.startswith("[") and body.endswith("]")):
        return text, []
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text, []
    if not isinstance(tree, ast.List) or not tree.elts:
        return text, []
    calls = []
    for node in tree.elts:
        name = _dotted(node.func) if isinstance(node, ast.Call) and not node.args else None
        if name is None or any(k.arg is None for k in node.keywords):  # positional or **kwargs: no call
            return text, []
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            calls.append(ToolCall(name, _json_text(arguments)))
        except (*_BAD_JSON, TypeError, SyntaxError, MemoryError):  # not a literal, or not JSON (a set, bytes)
            return text, []
    return None, calls


def _dotted(node: ast.expr) -> str | None:
    """`name` or `module.name` of a call; None for anything else. A loop: a model's chain of attributes
    may be thousands long."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


class ToolStream:
    """One streamed choice's text turned into what its chunks carry: content, tool-call deltas, or
    nothing yet. Content that may be the start of a call is held back until it is known which (auto);
    calls go out whole once they parse, except a named tool's arguments, which stream as they come."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""  # all of the choice's text so far
        self.sent = 0  # how much of it went out as content
        self.in_calls = False  # auto: a call has begun, the rest waits for the end
        self.decided = False  # llama3_json, pythonic: the reply's start showed whether it calls
        self.calls: list[ToolCall] = []
        self.spoke = False  # auto: content other than whitespace went out

    def feed(self, text: str, finished: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content, tool_calls deltas) to send for this piece of text; `finished`: it is the last."""
        mode = self.plan.mode
        if mode == "none":
            return text, []
        if mode == "named":
            if not self.calls and not text and not finished:
                return "", []  # nothing of the answer yet (a reasoning model still thinking): no call opened
            if not self.calls:
                assert self.plan.name is not None
                self.calls.append(ToolCall(self.plan.name, ""))
                head = self.calls[0].as_dict()
                head["function"]["arguments"] = text
                return "", [{"index": 0, **head}]
            return "", [{"index": 0, "function": {"arguments": text}}] if text else []
        self.text += text
        if mode == "auto" and not self.in_calls:
            content = self._content_so_far(finished)
            if not self.in_calls:
                return content, []
        else:
            content = ""
        if not finished:
            return content, []
        start = self.sent
        rest_content, calls = self.plan.extract(self.text[start:])  # required sends nothing first: start is 0
        if not calls:  # what was held back is content after all
            self.sent = len(self.text)
            return content + self.text[start:], []
        self.calls = calls
        if mode == "auto" and rest_content:  # text between the content sent and the first call
            content += rest_content
        return content, [{"index": i, **c.as_dict()} for i, c in enumerate(calls)]

    def _content_so_far(self, finished: bool) -> str:
        pending = self.text[self.sent :]
        if self.plan.parser == "hermes":
            at = pending.find(_HERMES_OPEN)
            if at >= 0:
                self.in_calls = True
                out = pending[:at]
            else:
                out = pending if finished else pending[: len(pending) - held_back(pending, _HERMES_OPEN)]
        else:  # llama3_json, pythonic: a reply that calls starts with its first call
            if not self.decided:
                head = pending.lstrip()
                parser = self.plan.parser or ""
                lead, tag = _LEADS[_ALIASES.get(parser, parser)]
                if not finished and len(head) < len(tag) and tag.startswith(head):
                    return ""  # "", "<", "<|py": not known yet
                self.decided = True
                if head.startswith((lead, tag)):
                    self.in_calls = True
                    return ""
            out = pending
        # Whitespace before anything else waits, unsent: a call may follow it (a whole reply's content is
        # none when only whitespace comes before its call), and it is content after all if none parses.
        if not self.spoke and not out.strip() and (self.in_calls or not finished):
            return ""
        self.spoke = self.spoke or bool(out.strip())
        self.sent += len(out)
        return out


def held_back(text: str, marker: str) -> int:
    """The length of text's longest end that could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
