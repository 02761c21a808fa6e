"""What a request may ask for in `SamplingParams(guided=...)`, checked before anything runs.

A request's constraint comes from outside, so every failure here is a ValueError that names it:
the engine returns it as that request's own error and the batch goes on.
"""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")

# JSON nesting a schema may have: 32 nested objects (each is two levels: the object, its
# "properties"). Far past real schemas, well inside both backends' own recursion limits.
MAX_DEPTH = 64
MAX_CHOICES = 4096

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60  # a hostile value's repr stays short and never recurses deep


class GrammarError(ValueError):
    """A constraint that does not compile (bad regex, bad EBNF, unsupported schema)."""


@dataclass(frozen=True, slots=True)
class GuidedSpec:
    kind: str  # one of KINDS
    source: str  # the schema or the choices as compact JSON, the pattern, or the EBNF; "" for json_object

    @property
    def key(self) -> tuple[str, str]:
        """Equal constraints share one compiled grammar."""
        return self.kind, self.source


def parse_spec(guided: Any) -> GuidedSpec:
    """{'json_schema': schema} | {'json_object': True} | {'regex': pattern} | {'choice': [str, ...]}
    | {'grammar': ebnf} -> GuidedSpec; anything else raises ValueError."""
    if isinstance(guided, GuidedSpec):
        return guided
    if not isinstance(guided, dict) or len(guided) != 1:
        raise ValueError(
            f"guided must be a dict with exactly one of {', '.join(KINDS)}, got {_short.repr(guided)}"
        )
    ((kind, value),) = guided.items()
    if kind not in KINDS:
        raise ValueError(
            f"guided: unknown constraint {_short.repr(kind)}; expected one of {', '.join(KINDS)}"
        )
    if kind == "json_object":
        if value is not True:
            raise ValueError(f"guided: json_object must be True, got {_short.repr(value)}")
        return GuidedSpec(kind, "")
    if kind == "json_schema":
        return GuidedSpec(kind, _canonical_schema(value))
    if kind == "choice":
        return GuidedSpec(kind, _canonical_choices(value))
    if not isinstance(value, str) or not value:
        raise ValueError(f"guided: {kind} must be a non-empty string, got {_short.repr(value)}")
    return GuidedSpec(kind, value)


def _canonical_schema(value: Any) -> str:
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer past Python's digit limit
            raise ValueError(f"guided: json_schema is not valid JSON: {exc}") from None
        except RecursionError:
            raise ValueError(f"guided: json_schema nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"guided: json_schema must be an object (a dict or its JSON), got {type(value).__name__}"
        )
    _check_json(value, "json_schema")
    # Keys keep their order: the backends generate properties in the order the schema lists them.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _check_json(root: Any, name: str) -> None:
    """Plain JSON data only: str keys; str, finite numbers, bools, None, lists and dicts; bounded depth.

    Walked with a stack, not recursion, so a hostile depth (or a cycle) is refused, never a RecursionError.
    """
    stack = [(root, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, (dict, list, tuple)) and depth > MAX_DEPTH:
            raise ValueError(f"guided: {name} nests deeper than {MAX_DEPTH} levels (at {where or '/'})")
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise ValueError(
                        f"guided: {name} has a key that is not a string: {_short.repr(k)} at {where or '/'}"
                    )
                stack.append((v, depth + 1, f"{where}/{k}"))
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1, f"{where}/{i}") for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"guided: {name} holds {value!r} at {where or '/'}, which JSON cannot encode")
        elif not (value is None or isinstance(value, (str, int, float, bool))):
            raise ValueError(
                f"guided: {name} holds a {type(value).__name__} at {where or '/'}; "
                "only JSON values (dict, list, str, number, bool, None) are allowed"
            )


def _canonical_choices(value: Any) -> str:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"guided: choice must be a non-empty list of strings, got {_short.repr(value)}")
    if len(value) > MAX_CHOICES:
        raise ValueError(f"guided: choice has {len(value)} strings; at most {MAX_CHOICES} are allowed")
    for c in value:
        if not isinstance(c, str) or not c:
            raise ValueError(f"guided: choice must hold non-empty strings, got {_short.repr(c)}")
    return json.dumps(list(value), ensure_ascii=False)
