"""A request's logit_bias, allowed_token_ids and bad_words as one list of token biases.

The sampler adds a request's biases to its logits before penalties (kernels/sampling.py), from its
penalty-table slot; a banned token's bias is -inf. A bad word of several tokens bans its last token
only where the row's last generated tokens are its first ones (runner/penalties.py). Checked here, at admission, against the model's
vocabulary and tokenizer, so a bad request fails alone with its own error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..runner.penalties import WORD_SEQUENCES, WORD_TOKENS
from .sampling_params import SamplingParams

BANNED = -math.inf


@dataclass(frozen=True, slots=True)
class TokenBiases:
    """exclusive: only the listed tokens may follow (allowed_token_ids); ids and their biases; the
    token sequences of bad words of several tokens."""

    exclusive: bool
    ids: tuple[int, ...]
    values: tuple[float, ...]
    sequences: tuple[tuple[int, ...], ...] = ()


def _in_vocab(name: str, ids: Any, vocab_size: int) -> None:
    bad = sorted(t for t in ids if t >= vocab_size)
    if bad:
        raise ValueError(f"{name}: token ids {bad[:8]} are out of range [0, {vocab_size})")


def bad_word_ids(word: str, tokenizer: Any) -> list[list[int]]:
    """The token sequences vLLM bans for a word: the word, and the word after a space where that is
    as many tokens and starts with another one (so it is a variant, not the word plus a space)."""
    bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
    spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
    variants = [bare]
    if spaced and bare and spaced[0] != bare[0] and len(spaced) == len(bare):
        variants.append(spaced)
    return [v for v in variants if v]


def banned_tokens(words: list[str], tokenizer: Any) -> tuple[set[int], list[tuple[int, ...]]]:
    """(tokens banned outright: words of one token, the token sequences of longer words)."""
    if tokenizer is None:
        raise ValueError("bad_words are matched as tokens, and this model has no tokenizer")
    banned: set[int] = set()
    sequences: set[tuple[int, ...]] = set()
    for word in words:
        for ids in bad_word_ids(word, tokenizer):
            if len(ids) > WORD_TOKENS:
                raise ValueError(
                    f"bad_words: {word!r} is {len(ids)} tokens; fastpath bans words of at most "
                    f"{WORD_TOKENS} tokens"
                )
            if len(ids) == 1:
                banned.add(ids[0])
            else:
                sequences.add(tuple(ids))
    if len(sequences) > WORD_SEQUENCES:
        raise ValueError(
            f"bad_words: {len(sequences)} token sequences of several tokens (a word and its variant "
            f"after a space count apart); fastpath holds at most {WORD_SEQUENCES} a request"
        )
    return banned, sorted(sequences)


def token_biases(
    params: SamplingParams, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int] = frozenset()
) -> TokenBiases | None:
    """The request's biases, or None when it has none; ValueError names what is wrong, including an
    allow-list that bans every token the request may generate (`eos_ids`: the model's, which end it
    unless ignore_eos, and which min_tokens bans until then)."""
    if not params.biased:
        return None
    bias = dict(params.logit_bias or {})
    _in_vocab("logit_bias", bias, vocab_size)
    allowed = params.allowed_token_ids
    if allowed is not None:
        _in_vocab("allowed_token_ids", allowed, vocab_size)
        # A bias on a token that may not follow changes nothing; the allowed ones keep theirs.
        bias = {t: bias.get(t, 0.0) for t in allowed}
    banned, sequences = banned_tokens(params.bad_words, tokenizer) if params.bad_words else (set(), [])
    _in_vocab("bad_words", banned | {t for seq in sequences for t in seq}, vocab_size)
    for t in banned:
        if allowed is None or t in bias:
            bias[t] = BANNED
    if allowed is not None:
        left = {t for t, v in bias.items() if v != BANNED}
        if not left:
            given = params.logit_bias or {}
            by = [name for name, on in (("logit_bias (-inf)", any(given.get(t) == BANNED for t in allowed)),
                                         ("bad_words", bool(banned.intersection(allowed)))) if on]  # fmt: skip
            raise ValueError(
                f"{' and '.join(by)} ban every one of allowed_token_ids {sorted(set(allowed))[:8]}"
            )
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_ids))
        if params.min_tokens and left <= stops:
            raise ValueError(
                f"allowed_token_ids: every token it allows ({sorted(left)[:8]}) is a stop token, which "
                f"min_tokens={params.min_tokens} bans until then"
            )
    ids = tuple(sorted(bias))
    return TokenBiases(allowed is not None, ids, tuple(bias[t] for t in ids), tuple(sequences))
