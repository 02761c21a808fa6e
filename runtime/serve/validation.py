"""A request body's validation errors as one 400: the key to blame and a message a person can act on.

pydantic reports every branch of a union it tried; the client wants to hear which shapes the field
takes. A misspelt key gets the field it was probably meant to be.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import validation_param
from .protocol import FieldError, every_key, misspelling_of

# Union fields, by their last key: the shapes they accept.
_SHAPES = {
    "prompt": "must be a string, a list of strings, a list of token ids (ints >= 0) or a list of such lists",
    "content": "must be a string, a list of text parts ({'type': 'text', 'text': ...}, or an assistant's "
    "{'type': 'refusal', 'refusal': ...}) or null",
    "stop": "must be a string or a list of strings",
    "guided_json": "must be a JSON schema object or its JSON text",
    "tool_choice": "must be 'none', 'auto', 'required' or a named tool",
}


def explain(errors: Sequence[dict[str, Any]]) -> tuple[str | None, str]:
    """(param, message) for pydantic's errors of one request body."""
    first = max(errors, key=lambda e: len(e.get("loc", ())))  # the deepest: a union's furthest branch
    loc = tuple(first.get("loc", ()))
    kind = first.get("type")
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        return cause.field, cause.detail
    if kind == "json_invalid":  # located at a character offset, which is no request key
        at = f" at character {loc[1]}" if len(loc) > 1 else ""
        return None, f"the body is not valid JSON{at}: {cause or first.get('msg')}"
    if loc == ("body",) and kind == "missing":
        return None, "the body is empty: send a JSON object (Content-Type: application/json)"
    if loc == ("body",) and kind in ("model_type", "model_attributes_type", "dict_type"):
        return None, "the body must be a JSON object (Content-Type: application/json)"
    param = validation_param(loc)
    if kind == "extra_forbidden":
        known = misspelling_of(str(loc[-1]), every_key() - {str(loc[-1])})
        hint = f"; did you mean {known!r}?" if known else ""
        return param, f"is not a field of this request{hint}"
    at = _union_at(loc)
    if at is not None:
        # No branch took the value. One branch that got further than the others names the real
        # problem (an image part: `type` should be 'text'); otherwise list the shapes the field takes.
        locs = [tuple(e.get("loc", ())) for e in errors]
        mine = [e for e in locs if e[: at + 1] == loc[: at + 1]]
        deeper = {e[at + 1] for e in mine if len(e) > at + 2}
        if len(mine) > 1 and len(deeper) != 1:
            return validation_param(loc[: at + 1]), _SHAPES[str(loc[at])]
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return param, message.removeprefix(f"{param}: ") if param else message


def _union_at(loc: tuple[Any, ...]) -> int | None:
    """Where in `loc` the innermost union field of _SHAPES sits, if the error is inside one."""
    for i in range(len(loc) - 1, 0, -1):
        if isinstance(loc[i], str) and loc[i] in _SHAPES:
            return i
    return None
