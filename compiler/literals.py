"""Python literals for generated code, spelled as `ruff format` leaves them.

This is how a manifest value reaches generated Python when it is not an identifier: escaped
here, never pasted. Strings take ruff's preferred quotes. A short container stays on one
line (it fits any line it is put on); a longer one is exploded one item per line with a
trailing comma, which ruff keeps as written.
"""

from __future__ import annotations

import math
from typing import Any

# A flat container this short fits on its line after any prefix these templates use.
FLAT_WIDTH = 60


class Code(str):
    """Text that is safe to paste into generated source: compiler-built or already escaped."""


def py_literal(value: Any, indent: int = 0) -> Code:
    """The source of `value` (None, bool, int, float, str, tuple, list, dict) at `indent` spaces."""
    if value is None or isinstance(value, bool | int):
        return Code(repr(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no Python literal")
        return Code(repr(value))
    if isinstance(value, str):
        return Code(py_str(value))
    if isinstance(value, tuple) and len(value) == 1:
        return Code(f"({py_literal(value[0], indent)},)")
    if isinstance(value, tuple | list):
        brackets = "()" if isinstance(value, tuple) else "[]"
        return _exploded(brackets, [py_literal(v, indent + 4) for v in value], indent)
    if isinstance(value, dict):
        items = [f"{py_str(_key(k))}: {py_literal(v, indent + 4)}" for k, v in value.items()]
        return _exploded("{}", items, indent)
    raise TypeError(f"no Python literal for {type(value).__name__}")


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"dict keys in generated code are strings, got {key!r}")
    return key


def _exploded(brackets: str, items: list[str], indent: int) -> Code:
    flat = brackets[0] + ", ".join(items) + brackets[1]
    if len(flat) <= FLAT_WIDTH and "\n" not in flat:
        return Code(flat)
    inner = " " * (indent + 4)
    body = "".join(f"{inner}{item},\n" for item in items)
    return Code(f"{brackets[0]}\n{body}{' ' * indent}{brackets[1]}")


def py_str(text: str) -> str:
    """A string literal. Double quotes unless the text holds more of them than single quotes."""
    quote = "'" if text.count('"') > text.count("'") else '"'
    out = []
    for char in text:
        if char == quote:
            out.append("\\" + char)
        elif char in "'\"":
            out.append(char)
        else:
            out.append(repr(char)[1:-1])  # Python's own escapes: \\, \n, \x00, \u2028, ...
    return quote + "".join(out) + quote
