"""Incremental detokenization and stop strings, for one completion.

Text grows a token at a time without re-decoding the whole output: a small window is decoded, and
text is released only once it no longer ends in a partial UTF-8 character (U+FFFD), so a character
split across tokens comes out whole. The window starts inside the prompt, so the first output token
keeps its leading space. Stop strings are searched where new text can complete one, so a match that
spans tokens is found; while a stop string might still be completing, that tail is held back from
streams.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

_CONTEXT = 6  # prompt tokens decoded before the output, so the first output token spaces correctly

Decode = Callable[[list[int], bool], str]
_DECODERS: weakref.WeakKeyDictionary[Any, Decode] = weakref.WeakKeyDictionary()
_PROBE = 512  # ids decoded both ways before the direct path is trusted


def text_decoder(tokenizer: Any) -> Decode:
    """`tokenizer.decode`, or the Rust tokenizer's own decode where that is all it would do.

    transformers' wrapper costs about five times the Rust call per decode, and a stream decodes
    twice per token: at 64 streams that was a quarter of the serving thread's time. The direct
    path is taken only without clean-up of tokenization spaces and when both ways agree on a probe
    of the vocabulary, with and without special tokens; anything else keeps `tokenizer.decode`.
    """
    try:
        return _DECODERS[tokenizer]
    except (KeyError, TypeError):
        pass

    def wrapped(ids: list[int], skip: bool) -> str:
        return tokenizer.decode(ids, skip_special_tokens=skip)

    chosen: Decode = wrapped
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:

        def direct(ids: list[int], skip: bool) -> str:
            return backend.decode(ids, skip_special_tokens=skip)

        try:
            size = min(int(backend.get_vocab_size()), _PROBE)
            probes = [list(range(i, min(i + 8, size))) for i in range(0, size, 8)]
            specials = list(getattr(tokenizer, "all_special_ids", []))[:16]
            probes += [[*specials, *p[:2]] for p in probes[:4]]
            if all(direct(p, skip) == wrapped(p, skip) for p in probes for skip in (True, False)):
                chosen = direct
        except Exception:  # any doubt keeps the wrapper
            chosen = wrapped
    with contextlib.suppress(TypeError):  # not weakly referable: decided again next time
        _DECODERS[tokenizer] = chosen
    return chosen


_TOKEN_TEXTS: weakref.WeakKeyDictionary[Any, Callable[[int], str]] = weakref.WeakKeyDictionary()


def token_text(tokenizer: Any) -> Callable[[int], str]:
    """One token's text as it reads inside a text, remembered per tokenizer.

    Logprobs name every top-k token: at 64 rows and top-5 that was 380 decodes per step, most of
    the host's profile of such a step on a CPU. A vocabulary's texts fit in a few MB.

    A token is decoded after an anchor token and the anchor's text cut off: SentencePiece-style
    decoders drop the leading space of a text's first token, so `decode([token])` alone reads
    "Paris" where the completion reads " Paris", and completions' `text_offset` would drift.
    """
    try:
        return _TOKEN_TEXTS[tokenizer]
    except (KeyError, TypeError):
        pass
    decode = text_decoder(tokenizer)
    anchor = _anchor(tokenizer, decode)
    texts: dict[int, str] = {}

    def text(token: int) -> str:
        s = texts.get(token)
        if s is None:
            s = decode([token], False)
            if anchor is not None:
                joined = decode([anchor[0], token], False)
                if joined.startswith(anchor[1]):
                    s = joined[len(anchor[1]) :]
            texts[token] = s
        return s

    with contextlib.suppress(TypeError):
        _TOKEN_TEXTS[tokenizer] = text
    return text


def _anchor(tokenizer: Any, decode: Decode) -> tuple[int, str] | None:
    """A plain token ("a") and its text, or None where the tokenizer cannot say which."""
    try:
        ids = tokenizer.encode("a", add_special_tokens=False)
        if ids:
            spelled = decode([ids[-1]], False)
            if spelled.strip():
                return ids[-1], spelled
    except Exception:  # a tokenizer without encode: single-token decodes are all there is
        pass
    return None


class IncrementalText:
    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: list[int],
        *,
        skip_special_tokens: bool = True,
        stop: tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self._decoder = text_decoder(tokenizer)
        self.skip = skip_special_tokens
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.min_tokens = min_tokens
        self.hold = max((len(s) for s in stop), default=1) - 1
        self._ids = list(prompt_ids[-_CONTEXT:])
        self._prefix = 0
        self._read = len(self._ids)
        self._outputs = 0
        self._floor = 0  # text before this came from the first min_tokens tokens
        self.text = ""
        self.emitted = 0  # characters of `text` already handed to a stream
        self.stop_hit: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self._decoder(ids, self.skip)

    def add(self, token_ids: list[int]) -> str | None:
        """Take new output tokens; returns the stop string they complete, if any (then text ends there)."""
        if self.stop_hit is not None:
            return self.stop_hit
        short = self.min_tokens - self._outputs
        if 0 < short < len(token_ids):  # the first min_tokens tokens' text is never searched
            self._take(token_ids[:short])
            token_ids = token_ids[short:]
        return self._take(token_ids)

    def _take(self, token_ids: list[int]) -> str | None:
        self._ids.extend(token_ids)
        self._outputs += len(token_ids)
        before = len(self.text)
        self._release(final=False)
        if self._outputs <= self.min_tokens:
            self._floor = len(self.text)
            return None
        return self._find_stop(before)

    def finish(self) -> None:
        """The completion ended. A character its last tokens left unfinished is left out (as vLLM
        does), not written as U+FFFD."""
        if self.stop_hit is None:
            before = len(self.text)
            self._release(final=True)
            self._find_stop(before)

    def _release(self, final: bool) -> None:
        head = self._decode(self._ids[self._prefix : self._read])
        full = self._decode(self._ids[self._prefix :])
        if final:  # what is whole is released; an unfinished last character is not
            full = full.rstrip("\ufffd")
        if len(full) > len(head) and (final or not full.endswith("\ufffd")):
            self.text += full[len(head) :]
            self._prefix, self._read = self._read, len(self._ids)

    def _find_stop(self, before: int) -> str | None:
        # As vLLM: stop strings count once more than min_tokens tokens exist, and only where they end
        # in text written after the first min_tokens tokens (stop token ids count after min_tokens too).
        if not self.stop or self._outputs <= self.min_tokens:
            return None
        start = max(0, before - self.hold)
        hits = [
            (i, s) for s in self.stop if (i := self.text.find(s, max(start, self._floor - len(s) + 1))) >= 0
        ]
        if not hits:
            return None
        i, s = min(hits)
        self.text = self.text[: i + len(s)] if self.include_stop else self.text[:i]
        self.stop_hit = s
        return s

    def take(self, final: bool) -> str:
        """Text not yet streamed; holds back a tail that may still grow into a stop string."""
        end = (
            len(self.text)
            if final or self.stop_hit is not None
            else max(self.emitted, len(self.text) - self.hold)
        )
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
