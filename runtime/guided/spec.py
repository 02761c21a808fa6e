"""What a request may ask for in `SamplingParams(guided=...)`, checked before anything runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "grammar")


@dataclass(frozen=True, slots=True)
class GuidedSpec:
    kind: str  # one of KINDS
    source: str  # the schema as canonical JSON, the pattern, or the EBNF; "" for json_object

    @property
    def key(self) -> tuple[str, str]:
        """Equal constraints share one compiled grammar."""
        return self.kind, self.source


def parse_spec(guided: Any) -> GuidedSpec:
    """{'json_schema': schema} | {'json_object': True} | {'regex': pattern} | {'grammar': ebnf} |
    {'choice': [str, ...]} -> GuidedSpec."""
    if not isinstance(guided, dict) or len(guided) != 1:
        raise ValueError(f"guided must be a dict with exactly one of {', '.join(KINDS)}, got {guided!r:.80}")
    ((kind, value),) = guided.items()
    if kind == "choice":  # one of these strings: a grammar of string literals (JSON escapes are EBNF's)
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise ValueError(
                f"guided: choice must be a non-empty list of non-empty strings, got {value!r:.80}"
            )
        literals = " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(value))
        return GuidedSpec("grammar", f"root ::= {literals}")
    if kind not in KINDS:
        raise ValueError(f"guided: unknown constraint {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "json_object":
        if value is not True:
            raise ValueError(f"guided: json_object must be True, got {value!r}")
        return GuidedSpec(kind, "")
    if kind == "json_schema":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"guided: json_schema is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(
                f"guided: json_schema must be an object (a dict or its JSON), got {type(value).__name__}"
            )
        return GuidedSpec(kind, json.dumps(value, sort_keys=True, separators=(",", ":")))
    if not isinstance(value, str) or not value:
        raise ValueError(f"guided: {kind} must be a non-empty string, got {value!r:.80}")
    return GuidedSpec(kind, value)
