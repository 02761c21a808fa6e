"""What `chat_template_kwargs` may carry: variables for the template, never arguments of the
tokenizer's call. `return_tensors`, `padding` or `max_length` there would change what the call
returns (an array, padded ids) instead of what the template renders. `documents` (a RAG template's
retrieved texts) is both, and passes through as vLLM passes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NOT_TEMPLATE_VARIABLES = frozenset(
    {
        "conversation", "chat_template", "add_generation_prompt", "continue_final_message", "tools",
        "tokenize", "return_tensors", "return_dict", "return_assistant_tokens_mask",
        "padding", "truncation", "max_length", "tokenizer_kwargs",
    }
)  # fmt: skip


def check_template_kwargs(kwargs: Mapping[str, Any] | None) -> None:
    """ValueError naming the first key that is an argument of apply_chat_template, not a variable."""
    if kwargs is None:
        return
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("chat_template_kwargs must be a mapping of variable names to values")
    bad = sorted(set(kwargs) & NOT_TEMPLATE_VARIABLES)
    if bad:
        raise ValueError(
            f"chat_template_kwargs: {bad[0]!r} is an argument of the tokenizer's chat call, not a template "
            "variable (the call's own arguments are set by the engine or the request's own fields)"
        )
