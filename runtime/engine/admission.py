"""The engine's door: a prompt and its SamplingParams become sequences, or the reason they cannot.

Everything a request carries is checked here, against what the model and the kernels accept, so
that nothing a single request holds can fail a step: token ids are ints in the vocabulary, the
request fits the sequence limit and the KV cache, its guided constraint compiles. A request that
fails any check gets its own error and never reaches the scheduler.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

from .sampling_params import MAX_INT64, SamplingParams
from .sequence import Sequence

Prompt = str | Seq[int] | Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Limits:
    vocab_size: int
    max_seq_len: int
    cache_tokens: int  # the most tokens one sequence can hold in the KV cache


@dataclass(slots=True)
class Admitted:
    prompt: str | None
    prompt_ids: list[int]
    cache_salt: str | None = None  # the prompt dict's: its sequences find only blocks of the same salt


def is_single_prompt(prompts: Any) -> bool:
    """A lone prompt (text, token ids, or a prompt dict) rather than a list of them."""
    if isinstance(prompts, (str, Mapping)):
        return True
    return isinstance(prompts, (list, tuple)) and bool(prompts) and isinstance(prompts[0], numbers.Integral)


def encode(
    prompt: Prompt, tokenizer: Any, limits: Limits, truncate: int | None = None, room: int = 1
) -> Admitted:
    """The prompt's text (if any) and token ids, the last `truncate` of them when it is set (-1: as many
    as leave `room`); ValueError says what is wrong with it. `room` 0: a prompt that generates
    nothing (pooling) may fill max_seq_len."""
    if room == 0:
        admitted = _encode(prompt, tokenizer, None)
        if truncate is not None:
            admitted.prompt_ids = admitted.prompt_ids[-(limits.max_seq_len if truncate == -1 else truncate) :]
        if len(admitted.prompt_ids) > limits.max_seq_len:
            raise ValueError(
                f"prompt of {len(admitted.prompt_ids)} tokens is longer than max_seq_len (max_model_len) "
                f"{limits.max_seq_len} (truncate_prompt_tokens keeps its last tokens)"
            )
        admitted.prompt_ids = check_ids(admitted.prompt_ids, limits, room=0)
        return admitted
    if truncate is not None and truncate >= limits.max_seq_len:
        raise ValueError(
            f"truncate_prompt_tokens {truncate} leaves no room to generate: max_seq_len (max_model_len) is "
            f"{limits.max_seq_len}; choose a smaller one, or -1 for as many as leave room"
        )
    admitted = _encode(prompt, tokenizer, limits if truncate is None else None)
    if truncate is not None:
        keep = limits.max_seq_len - 1 if truncate == -1 else truncate
        admitted.prompt_ids = check_ids(admitted.prompt_ids[-keep:], limits)
    return admitted


def _encode(prompt: Prompt, tokenizer: Any, limits: Limits | None) -> Admitted:
    """As encode, before truncation; `limits` None checks only what truncation cannot change."""
    salt = check_cache_salt(prompt.get("cache_salt")) if isinstance(prompt, Mapping) else None
    admitted = _encode_unsalted(prompt, tokenizer, limits)
    admitted.cache_salt = salt
    return admitted


def _encode_unsalted(prompt: Prompt, tokenizer: Any, limits: Limits | None) -> Admitted:
    if isinstance(prompt, Mapping):
        if prompt.get("multi_modal_data"):  # never dropped without a word
            raise ValueError("multi_modal_data: this engine's models take text only")
        # mm_processor_kwargs changes nothing here: there is no multimodal data to process.
        keys = set(prompt) - {"multi_modal_data", "mm_processor_kwargs", "cache_salt"}
        if keys == {"prompt_token_ids"} or keys == {"prompt_token_ids", "prompt"}:
            return Admitted(prompt.get("prompt"), check_ids(prompt["prompt_token_ids"], limits))
        if keys != {"prompt"}:
            raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(keys)}")
        prompt = prompt["prompt"]
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer, and this model has none: pass token ids")
        return Admitted(prompt, check_ids(list(tokenizer(prompt)["input_ids"]), limits))
    return Admitted(None, check_ids(prompt, limits))


def salted(prompt: Any, salt: str | None) -> Any:
    """A prompt (text, token ids or a prompt dict) carrying `salt` as its cache_salt; as it is without."""
    if salt is None:
        return prompt
    if isinstance(prompt, str):
        return {"prompt": prompt, "cache_salt": salt}
    if isinstance(prompt, Mapping):
        return {**prompt, "cache_salt": salt}
    return {"prompt_token_ids": prompt, "cache_salt": salt}


def check_cache_salt(salt: Any) -> str | None:
    """A prompt's cache_salt: None, or a non-empty string (as vLLM takes it)."""
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}")
    return str.__str__(salt) if salt is not None else None  # a str subclass as the plain str it spells


def check_ids(ids: Any, limits: Limits | None, room: int = 1) -> list[int]:
    """The ids as a list of ints; with `limits`, also within the vocabulary and leaving room to
    generate (without, only their form: the caller truncates them first)."""
    if not isinstance(ids, (list, tuple)):
        raise ValueError(
            f"prompt must be a string, a list of token ids or a prompt dict, got {type(ids).__name__}"
        )
    if all(type(t) is int for t in ids):  # the common case, without an isinstance per token
        out = list(ids)
    else:
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise ValueError(f"token ids must be ints, got {t!r} ({type(t).__name__})")
        out = [int(t) for t in ids]
    if not out:
        raise ValueError("empty prompt")
    if limits is None:
        return out
    if len(out) + room > limits.max_seq_len:
        raise ValueError(
            f"prompt of {len(out)} tokens leaves no room to generate: "
            f"max_seq_len (max_model_len) is {limits.max_seq_len} (truncate_prompt_tokens keeps its last tokens)"
        )
    if min(out) < 0 or max(out) >= limits.vocab_size:  # then name the first, as the error always has
        bad = next(t for t in out if not 0 <= t < limits.vocab_size)
        raise ValueError(f"token id {bad} is out of range [0, {limits.vocab_size})")
    return out


def check_request(ids: list[int], params: SamplingParams, limits: Limits) -> None:
    """What SamplingParams cannot know alone: limits of this model and this cache."""
    bad = next((t for t in params.stop_token_ids if t >= limits.vocab_size), None)
    if bad is not None:
        raise ValueError(f"stop_token_ids: {bad} is out of range [0, {limits.vocab_size})")
    longest = min(limits.max_seq_len, len(ids) + (params.max_tokens or limits.max_seq_len))
    if longest > limits.cache_tokens:
        raise ValueError(
            f"the request needs up to {longest} tokens of KV cache, and the cache holds {limits.cache_tokens} "
            "for one sequence: lower max_tokens, or give the engine more cache (kv_cache_blocks)"
        )


def completion_seeds(params: SamplingParams, derived: int) -> list[int]:
    """The seed of each of n completions: the request's seed + i (mod 2**63), else engine-derived ones."""
    base = params.seed if params.seed is not None else derived
    return [(base + i) % (MAX_INT64 + 1) for i in range(params.n)]


class GuidedAdmission:
    """Compiles a request's constraint into its matcher state; one at a time (the grammar cache is shared)."""

    def __init__(self, decoder: Any, backend_hint: str) -> None:
        self.decoder = decoder
        self.hint = backend_hint
        self._lock = threading.Lock()

    def state(self, guided: Any, prompt_ids: list[int] | None = None, tokenizer: Any = None) -> Any:
        from ..guided.backends import off_message
        from ..guided.spec import parse_spec

        if self.decoder is None:
            raise ValueError(off_message(self.hint))
        spec = parse_spec(guided)
        gate = reasoning_gate(spec.after_reasoning, prompt_ids or [], tokenizer)
        with self._lock:
            return self.decoder.state_for(spec, gate)


def reasoning_gate(markers: tuple[str, str] | None, prompt_ids: list[int], tokenizer: Any) -> int | None:
    """The token after which a grammar holds a reasoning model's reply: its close marker, one token of
    the tokenizer; None (the grammar from the first token) without markers or where the prompt already
    closed the thinking (a template that turned it off), as vLLM judges a prompt's reasoning ended."""
    if markers is None:
        return None
    if tokenizer is None:
        raise ValueError("guided: after_reasoning needs the model's tokenizer, and this engine has none")
    opening, closing = (_one_token(tokenizer, m) for m in markers)
    if closing is None:
        raise ValueError(
            f"guided: after_reasoning: {markers[1]!r} is not one token of this model's tokenizer"
        )
    return None if _last(prompt_ids, closing) > _last(prompt_ids, opening) else closing


def _last(ids: list[int], token: int | None) -> int:
    """Where `token` last occurs in `ids`, -1 if nowhere (a scan in C, from the end)."""
    if token is None:
        return -1
    try:
        return len(ids) - 1 - ids[::-1].index(token)
    except ValueError:
        return -1


def _one_token(tokenizer: Any, marker: str) -> int | None:
    ids = tokenizer.encode(marker, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def make_sequences(
    seq_ids: list[int],
    admitted: Admitted,
    params: SamplingParams,
    seeds: list[int],
    limits: Limits,
    guided: list[Any],
    eos_ids: frozenset[int],
    primary_eos: int | None = None,
    biases: Any = None,
) -> list[Sequence]:
    return [
        Sequence(
            seq_id,
            list(admitted.prompt_ids),
            params,
            seed,
            eos_ids,
            limits.max_seq_len,
            index=i,
            primary_eos=primary_eos,
            guided=guided[i],
            biases=biases,
            cache_salt=admitted.cache_salt,
        )
        for i, (seq_id, seed) in enumerate(zip(seq_ids, seeds, strict=True))
    ]
