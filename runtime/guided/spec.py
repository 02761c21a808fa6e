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

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar", "structural_tag")
# Keys a constraint's dict may hold beside its one kind, with vLLM's names and meanings.
OPTIONS = (
    "backend",
    "disable_any_whitespace",
    "whitespace_pattern",
    "disable_additional_properties",
    "after_reasoning",
)
BACKENDS = ("auto", "xgrammar", "llguidance")
_BACKEND_ALIASES = {"guidance": "llguidance"}  # vLLM's name for llguidance
JSON_KINDS = ("json_schema", "json_object")  # the kinds whitespace options apply to

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
    # The schema, the choices or the structural tag as compact JSON, the pattern, or the grammar
    # (EBNF or Lark); "" for json_object.
    source: str
    backend: str = "auto"  # the backend the request asks for: "auto" is the engine's
    any_whitespace: bool = False  # JSON kinds: free whitespace between tokens (vLLM's default)
    whitespace_pattern: str | None = None  # JSON kinds: the whitespace allowed between tokens
    # A reasoning model's (open, close) thinking markers: the grammar holds the reply from the token after
    # the close marker (admission.reasoning_gate). Not part of the key: the grammar is the same.
    after_reasoning: tuple[str, str] | None = None

    @property
    def key(self) -> tuple[str, str, bool, str | None]:
        """Equal constraints share one compiled grammar (an engine has one backend: not part of it)."""
        return self.kind, self.source, self.any_whitespace, self.whitespace_pattern


def backend_name(value: Any, field: str = "guided: backend") -> str:
    """The backend a request names: "auto" (or None) for the engine's, else xgrammar or llguidance."""
    name = "auto" if value is None else _BACKEND_ALIASES.get(value, value) if isinstance(value, str) else ""
    if name not in BACKENDS:
        raise ValueError(
            f"{field} must be one of {', '.join(BACKENDS)} (or vLLM's 'guidance'), got {_short.repr(value)}"
        )
    return name


def reasoning_markers(value: Any, field: str = "guided: after_reasoning") -> tuple[str, str]:
    """A reasoning model's (open, close) thinking markers, checked: two non-empty strings."""
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(m, str) and m for m in value)
    ):
        raise ValueError(
            f"{field} must be a reasoning model's two thinking markers, like ('<think>', '</think>'), "
            f"got {_short.repr(value)}"
        )
    return tuple(value)


def parse_spec(guided: Any) -> GuidedSpec:
    """{'json_schema': schema} | {'json_object': True} | {'regex': pattern} | {'choice': [str, ...]}
    | {'grammar': ebnf or lark} | {'structural_tag': tag} -> GuidedSpec, with any of OPTIONS beside
    the constraint (GuidedDecodingParams' meanings); anything else raises ValueError."""
    if isinstance(guided, GuidedSpec):
        return guided
    if isinstance(guided, dict):
        unknown = [k for k in guided if k not in KINDS and k not in OPTIONS]
        if unknown:
            raise ValueError(
                f"guided: unknown constraint {_short.repr(unknown[0])}; expected one of {', '.join(KINDS)}"
            )
    kinds = [k for k in guided if k in KINDS] if isinstance(guided, dict) else []
    if len(kinds) != 1:
        raise ValueError(
            f"guided must be a dict with exactly one of {', '.join(KINDS)}, got {_short.repr(guided)}"
        )
    kind, value = kinds[0], guided[kinds[0]]
    options = _options(guided, kind)
    if kind == "json_object":
        if value is not True:
            raise ValueError(f"guided: json_object must be True, got {_short.repr(value)}")
        return GuidedSpec(kind, "", **options)
    if kind == "json_schema":
        source = _canonical_object(value, "json_schema")
        if guided.get("disable_additional_properties"):
            source = _without_additional_properties(source)
        return GuidedSpec(kind, source, **options)
    if kind == "choice":
        return GuidedSpec(kind, _canonical_choices(value), **options)
    if kind == "structural_tag":
        return GuidedSpec(kind, _canonical_object(value, kind), **options)
    if not isinstance(value, str) or not value:
        raise ValueError(f"guided: {kind} must be a non-empty string, got {_short.repr(value)}")
    return GuidedSpec(kind, value, **options)


def _options(guided: dict[str, Any], kind: str) -> dict[str, Any]:
    """GuidedSpec's options from the dict's OPTIONS keys, checked."""
    for name in ("disable_any_whitespace", "disable_additional_properties"):
        if guided.get(name) is not None and not isinstance(guided[name], bool):
            raise ValueError(f"guided: {name} must be a bool, got {_short.repr(guided[name])}")
    pattern = guided.get("whitespace_pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise ValueError(f"guided: whitespace_pattern must be a string, got {_short.repr(pattern)}")
    disable = guided.get("disable_any_whitespace")
    if pattern is not None and disable:
        raise ValueError(
            "guided: whitespace_pattern and disable_any_whitespace=True both say what whitespace JSON "
            "may hold; set one"
        )
    backend = backend_name(guided.get("backend"))
    markers = guided.get("after_reasoning")
    after = {"after_reasoning": reasoning_markers(markers)} if markers is not None else {}
    if kind not in JSON_KINDS:  # whitespace is JSON's: other kinds ignore it, as in vLLM
        return {"backend": backend, **after}
    # None: this engine's compact JSON (a random-weight model may otherwise emit whitespace for
    # ever); False, said outright, is vLLM's default: any whitespace.
    return {
        "backend": backend,
        "any_whitespace": disable is False and pattern is None,
        "whitespace_pattern": pattern,
        **after,
    }


def _without_additional_properties(source: str) -> str:
    """vLLM's disable_additional_properties: every object schema that lists properties and says
    nothing of others gets "additionalProperties": false. `source` is canonical: a tree, depth-bounded."""
    schema = json.loads(source)
    stack = [schema]
    while stack:
        value = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend(v for v in children if isinstance(v, (dict, list)))
        listed = isinstance(value, dict) and ("properties" in value or "patternProperties" in value)
        if listed and "additionalProperties" not in value:
            value["additionalProperties"] = False
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _canonical_object(value: Any, name: str) -> str:
    """A schema or a structural tag (a dict or its JSON text) as compact JSON."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer past Python's digit limit
            raise ValueError(f"guided: {name} is not valid JSON: {exc}") from None
        except RecursionError:
            raise ValueError(f"guided: {name} nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise ValueError(f"guided: {name} must be an object (a dict or its JSON), got {type(value).__name__}")
    _check_json(value, name)
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
