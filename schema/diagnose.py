"""pydantic validation errors -> compiler-style diagnostics pointing at the YAML that caused them."""

from __future__ import annotations

import math
from typing import Any

from pydantic import AliasChoices, BaseModel, ValidationError

from .errors import Diagnostic, FieldError
from .models import Manifest
from .suggest import did_you_mean
from .yaml_source import Mark, Path, YamlDocument

_MAPPING_TYPES = {"model_type", "model_attributes_type", "dict_type"}
# The checks a NaN or an infinity fails on a number field (a string field's "must be a string" stays).
_NUMBER_BOUNDS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number",
                  "int_from_float", "int_type", "int_parsing", "multiple_of"}  # fmt: skip


def diagnostics(exc: ValidationError, doc: YamlDocument, filename: str) -> list[Diagnostic]:
    result = []
    for error in exc.errors(include_url=False):
        path, message, at_key = _describe(error, doc)
        line, column = _locate(path, doc, at_key)
        key = dotted(path) if path else ""
        result.append(Diagnostic(filename, line, column, message, key))
    return result


def _describe(error: Any, doc: YamlDocument) -> tuple[Path, str, bool]:
    """(path to point at, message, whether to point at the key rather than its value)."""
    loc: Path = tuple(error["loc"])
    kind = error["type"]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        path = loc + cause.path
        return path, f"{dotted(path)}: {cause}", True
    if kind == "extra_forbidden":
        return loc, _unknown_key(loc, doc), True
    if kind == "missing":
        where = f" in {dotted(loc[:-1])}" if loc[:-1] else ""
        return loc[:-1], f"missing required key {loc[-1]!r}{where}", True
    if isinstance(cause, ValueError):
        message = str(cause)
    elif kind == "literal_error":
        message = f"{error['input']!r} is not one of {error['ctx']['expected']}"
        message += did_you_mean(error["input"], _quoted(error["ctx"]["expected"]))
    elif kind in _MAPPING_TYPES:
        message = f"must be a mapping of keys, got {_short(error['input'])}"
        if error["input"] is None:
            message += " (write {} for an empty section)"
    elif (
        kind in _NUMBER_BOUNDS and isinstance(error.get("input"), float) and not math.isfinite(error["input"])
    ):
        message = f"must be a finite number, got {error['input']!r}"  # not "less than 3600, got nan"
    elif kind == "too_short":
        least = (error.get("ctx") or {}).get("min_length", 1)
        message = f"must list at least {least} item{'s' if least != 1 else ''}, got {_short(error['input'])}"
    elif kind in ("tuple_type", "list_type"):
        message = f"must be a list (write [x] for one item), got {_short(error['input'])}"
    else:
        message = error["msg"].replace("Input should be", "must be", 1) + f", got {_short(error['input'])}"
    return loc, f"{dotted(loc)}: {message}", False


def dotted(path: Path) -> str:
    """('fmha', 'prepend', 0) -> 'fmha.prepend[0]'."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "manifest"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _quoted(expected: str) -> list[str]:
    # pydantic lists a Literal's values as "'a', 'b' or 'c'".
    return [part.strip(" '") for part in expected.replace(" or ", ", ").split(", ")]


def _unknown_key(loc: Path, doc: YamlDocument) -> str:
    parent, key = loc[:-1], loc[-1]
    spellings = _spellings(_model_at(parent))
    where = f" in {dotted(parent)}" if parent else ""
    for field, names in spellings.items():
        given = [n for n in names if (*parent, n) in doc.keys]
        if key in names and len(given) > 1:
            return f"{key!r} is another spelling of {field!r}{where}; give only one of {', '.join(given)}"
    known = [name for names in spellings.values() for name in names]
    hint = did_you_mean(key, known) or f"; known keys: {', '.join(known)}"
    return f"unknown key {key!r}{where}{hint}"


def _model_at(path: Path) -> type[BaseModel]:
    model: type[BaseModel] = Manifest
    for part in path:
        field = model.model_fields[part]
        model = field.annotation  # every mapping in a manifest is a model
    return model


def _spellings(model: type[BaseModel]) -> dict[str, list[str]]:
    """field name -> every key that sets it (the name first, then its aliases)."""
    result = {}
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        choices = [c for c in alias.choices if isinstance(c, str)] if isinstance(alias, AliasChoices) else []
        result[name] = [name, *(c for c in choices if c != name)]
    return result


def _locate(path: Path, doc: YamlDocument, at_key: bool) -> Mark:
    """The mark of the key or value at `path`, else of its nearest ancestor, else the file's start."""
    while True:
        for candidate in _written_as(path, doc):
            if at_key and candidate in doc.keys:
                return doc.keys[candidate]
            if candidate in doc.values:
                return doc.values[candidate]
        if not path:
            return 1, 1
        path, at_key = path[:-1], True


def _written_as(path: Path, doc: YamlDocument) -> list[Path]:
    """`path`, and the same path with its last key spelled by an alias (as the YAML may have it)."""
    if not path or not isinstance(path[-1], str):
        return [path]
    try:
        names = _spellings(_model_at(path[:-1])).get(path[-1], [path[-1]])
    except (KeyError, AttributeError):
        return [path]
    return [(*path[:-1], name) for name in names]
