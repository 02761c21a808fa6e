"""A token's own bytes, for logprobs' `bytes` field: OpenAI's API carries them so a client can rebuild
a character split across tokens, whose text alone is U+FFFD."""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Callable
from typing import Any

from .detokenizer import token_text

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback
_CACHE: weakref.WeakKeyDictionary[Any, Callable[[int], bytes]] = weakref.WeakKeyDictionary()


def token_bytes(tokenizer: Any) -> Callable[[int], bytes]:
    """token id -> its bytes: the UTF-8 of its text, or, where that text is a partial character, the
    raw bytes its vocabulary entry stands for (byte-level BPE's alphabet, or `<0xNN>` pieces)."""
    with contextlib.suppress(KeyError, TypeError):
        return _CACHE[tokenizer]
    text = token_text(tokenizer)
    byte_of: dict[str, int] = {}
    with contextlib.suppress(Exception):  # no such table: UTF-8 of the text is all there is
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        byte_of = {c: b for b, c in bytes_to_unicode().items()}

    def raw(token: int) -> bytes:
        spelled = text(token)
        if "\ufffd" not in spelled:
            return spelled.encode("utf-8")
        piece = tokenizer.convert_ids_to_tokens(token)
        match = _BYTE_TOKEN.fullmatch(piece or "")
        if match:
            return bytes([int(match.group(1), 16)])
        if piece and byte_of and all(c in byte_of for c in piece):
            return bytes(byte_of[c] for c in piece)
        return spelled.encode("utf-8")

    with contextlib.suppress(TypeError):
        _CACHE[tokenizer] = raw
    return raw
