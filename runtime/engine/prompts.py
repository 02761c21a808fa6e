"""vLLM's prompt dicts, as typed dicts: `TextPrompt(prompt=...)` and `TokensPrompt(prompt_token_ids=...)`.

Plain dicts of the same keys work the same; these give type checkers and vLLM's imports their names.
admission.encode reads both.
"""

from __future__ import annotations

from typing import Any, TypedDict


class _Extras(TypedDict, total=False):
    multi_modal_data: Any  # refused when not empty: the models take text only
    mm_processor_kwargs: Any
    cache_salt: str  # keys the prefix cache: prompts under different salts never share cached KV


class TextPrompt(_Extras):
    prompt: str


class _TokensExtras(_Extras, total=False):
    prompt: str  # the text, when the caller has it: outputs carry it back


class TokensPrompt(_TokensExtras):
    prompt_token_ids: list[int]
