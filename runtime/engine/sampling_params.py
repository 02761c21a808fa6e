"""Per-request generation settings with vLLM's names and meanings, validated at construction.

A bad value raises ValueError naming the field and what it accepts, so a bad request fails alone,
before it reaches the engine. Limits that depend on the model (vocabulary, sequence length, how many
stop ids fit a step) are checked again at admission (engine/admission.py).
"""

from __future__ import annotations

import difflib
import logging
import math
import numbers
import reprlib
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass, field, fields
from typing import Any

from ..runner.penalties import WORD_SEQUENCES, WORD_TOKENS

MAX_INT64 = (1 << 63) - 1
MAX_TOKEN_ID = (1 << 31) - 1
MIN_TEMPERATURE = 0.01  # vLLM's floor for a positive temperature
_warned: set[str] = set()


def _parse_spec(spec: dict[str, Any]) -> None:
    """The constraint checked here, where the request enters (its depth above all: a schema nested
    hundreds deep could not even be pickled to the engine process)."""
    from ..guided.spec import parse_spec

    parse_spec(spec)


def _warn_once(message: str) -> None:
    key = message.split(" ", 2)[0]
    if key not in _warned:
        _warned.add(key)
        logging.getLogger("fastpath").warning(message)


MAX_STOP_STRINGS = 128
MAX_STOP_CHARS = 16384
MAX_LOGPROBS = 20  # top-k logprobs a request may ask for (vLLM's default max_logprobs)
MAX_N = 256
MAX_BIASED = 1024  # logit_bias entries, allowed_token_ids and bad_words each (as vLLM's GPU runner)

GUIDED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


def doc(text: str) -> dict[str, str]:
    """A field's documentation, as its metadata: docs/api.md is generated from it."""
    return {"doc": text}


@dataclass(frozen=True, slots=True, kw_only=True)
class GuidedDecodingParams:
    """One structured-output constraint, as vLLM spells it (StructuredOutputsParams is this class): exactly
    one of json, json_object, regex, choice, grammar and structural_tag is set; the rest are options."""

    json: dict[str, Any] | str | None = field(
        default=None, metadata=doc("A JSON schema (a dict, or its JSON text).")
    )
    json_object: bool | None = field(
        default=None, metadata=doc("Any JSON object (an object: never an array or a bare value).")
    )
    regex: str | None = field(default=None, metadata=doc("A regular expression the whole output matches."))
    choice: list[str] | None = field(default=None, metadata=doc("Exactly one of these strings."))
    grammar: str | None = field(
        default=None,
        metadata=doc(
            "An EBNF (GBNF) grammar, or a Lark one: llguidance reads all of Lark, xgrammar its common "
            "subset (rules, strings, ranges, /regex/, ? * + ~, [ ], parentheses), converted."
        ),
    )
    structural_tag: dict[str, Any] | str | None = field(
        default=None,
        metadata=doc(
            "vLLM's structural tag (its JSON text, or a dict): free text, with a JSON schema between each "
            "begin and end. Both backends take {'structures': [{'begin', 'schema', 'end'}], 'triggers': "
            "[...]}; xgrammar also its own {'type': 'structural_tag', 'format': ...}."
        ),
    )
    backend: str | None = field(
        default=None,
        metadata=doc(
            "The backend this request needs: None or 'auto' is the engine's; 'xgrammar' or 'llguidance' "
            "('guidance', vLLM's name) must be the one the engine guides with (LLM(guided_backend=...)), "
            "else the request fails naming the one available."
        ),
    )
    disable_any_whitespace: bool | None = field(
        default=None,
        metadata=doc(
            "Whitespace in JSON. None (the default) or True: compact JSON, ', ' and ': ' only (a weak "
            "model may otherwise emit whitespace for ever); False, vLLM's default: any whitespace "
            "between tokens."
        ),
    )
    whitespace_pattern: str | None = field(
        default=None,
        metadata=doc(
            "A regular expression for the whitespace JSON may hold between tokens (llguidance; xgrammar "
            "fails the request: it has disable_any_whitespace only)."
        ),
    )
    disable_additional_properties: bool = field(
        default=False,
        metadata=doc(
            "JSON schema: every object that lists properties and says nothing of others gets "
            "additionalProperties: false (as in vLLM)."
        ),
    )
    disable_fallback: bool = field(
        default=False,
        metadata=doc("Accepted for vLLM compatibility: this engine never falls back to another backend."),
    )
    after_reasoning: tuple[str, str] | None = field(
        default=None,
        metadata=doc(
            "A reasoning model's thinking markers, like ('<think>', '</think>'): the model thinks freely, "
            "and the constraint holds the reply from the token after the close marker it writes, as vLLM "
            "applies structured outputs after the reasoning; from the first token where the prompt "
            "already closed the thinking (its last close marker after its last open one). The close "
            "marker must be one token of the tokenizer; an open marker that is not one is not looked "
            "for. The server sets it under --reasoning-parser."
        ),
    )

    def __post_init__(self) -> None:
        from ..guided.spec import backend_name, reasoning_markers

        given = [k for k in GUIDED_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"GuidedDecodingParams: set exactly one of {', '.join(GUIDED_KINDS)}; got {given or 'none'}"
            )
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) for c in self.choice):
                raise ValueError("GuidedDecodingParams.choice must be a non-empty list of strings")
            object.__setattr__(self, "choice", list(self.choice))
        backend_name(self.backend, "GuidedDecodingParams.backend")
        for name in ("disable_any_whitespace", "disable_additional_properties", "disable_fallback"):
            value = getattr(self, name)
            if not (isinstance(value, bool) or (value is None and name == "disable_any_whitespace")):
                raise ValueError(f"GuidedDecodingParams.{name} must be a bool, got {reprlib.repr(value)}")
        pattern = self.whitespace_pattern
        if pattern is not None and not isinstance(pattern, str):
            raise ValueError(
                f"GuidedDecodingParams.whitespace_pattern must be a string, got {reprlib.repr(pattern)}"
            )
        if self.after_reasoning is not None:
            markers = reasoning_markers(self.after_reasoning, "GuidedDecodingParams.after_reasoning")
            object.__setattr__(self, "after_reasoning", markers)

    def __hash__(self) -> int:
        # A schema or tag given as a dict cannot be hashed: equal params still hash equal without it.
        values = (getattr(self, name) for name in self.__dataclass_fields__)
        return hash(
            tuple(tuple(v) if isinstance(v, list) else None if isinstance(v, dict) else v for v in values)
        )

    def as_spec(self) -> dict[str, Any]:
        """The runtime's constraint dict (guided/spec.py), with the options this request sets."""
        options = {
            "backend": self.backend,
            "disable_any_whitespace": self.disable_any_whitespace,
            "whitespace_pattern": self.whitespace_pattern,
            "disable_additional_properties": self.disable_additional_properties or None,
            "after_reasoning": list(self.after_reasoning) if self.after_reasoning else None,
        }
        return {**self._constraint(), **{k: v for k, v in options.items() if v is not None}}

    def _constraint(self) -> dict[str, Any]:
        if self.json is not None:
            return {"json_schema": self.json}
        if self.json_object:
            return {"json_object": True}
        if self.regex is not None:
            return {"regex": self.regex}
        if self.choice is not None:
            return {"choice": list(self.choice)}
        if self.structural_tag is not None:
            return {"structural_tag": self.structural_tag}
        return {"grammar": self.grammar}


# vLLM's newer name for the same parameters.
StructuredOutputsParams = GuidedDecodingParams


def _check(ok: bool, name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name} must be {allowed}, got {reprlib.repr(value)}")


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(v)
    return tuple(sorted(v.items())) if isinstance(v, dict) else v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _plain(v: Any) -> Any:
    """NumPy's (or any) integers and reals as Python's int and float; anything else as it is."""
    if isinstance(v, bool) or type(v) in (int, float):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return v


def _token_ids(name: str, value: Any) -> list[int]:
    if value is None:  # vLLM's default, which its callers pass explicitly
        return []
    ids = [_plain(t) for t in value] if isinstance(value, (list, tuple)) else None
    _check(ids is not None, name, "a list of token ids", value)
    for t in ids:
        _check(_is_int(t) and 0 <= t <= MAX_TOKEN_ID, name, f"token ids in [0, {MAX_TOKEN_ID}]", value)
    return ids


# vLLM's SamplingParams fields fastpath lacks, and what to do instead: a TypeError that says so, not a
# "did you mean" pointing at an unrelated field.
def _output_kind_is_final_or_cumulative(value: Any) -> bool:
    # vLLM's RequestOutputKind: CUMULATIVE (0, its default) and FINAL_ONLY (2) both end, under
    # generate(), in the final outputs fastpath returns; DELTA (1) is stream()'s.
    name = getattr(value, "name", None)
    value = _plain(value)
    return value is None or name in ("CUMULATIVE", "FINAL_ONLY") or (_is_int(value) and value in (0, 2))


# vLLM's fields fastpath has nothing behind: (what fastpath does instead, the values taken as vLLM
# code passes them by default, which change nothing, and a test of a value for them).
VLLM_MISSING: dict[str, tuple[str, str, Callable[[Any, dict[str, Any]], bool]]] = {
    "logits_processors": (
        "no Python logits processors: sampling runs in fused kernels inside the step",
        "None or an empty list",
        lambda v, kw: v is None or (isinstance(v, list | tuple) and not v),
    ),
    "best_of": (
        "n completions are sampled and all returned; none are ranked away",
        "None or n",
        lambda v, kw: v is None or (_is_int(_plain(v)) and _plain(v) == _plain(kw.get("n", 1))),
    ),
    "output_kind": (
        "generate() returns final outputs; stream() and submit() give deltas",
        "None, CUMULATIVE or FINAL_ONLY",
        lambda v, kw: _output_kind_is_final_or_cumulative(v),
    ),
    "extra_args": ("no extension arguments", "None or {}", lambda v, kw: v is None or v == {}),
    "flat_logprobs": (
        "logprobs are a list of {token id: Logprob} dicts, one a position",
        "False",
        lambda v, kw: v is False,
    ),
}


def _vllm_doc(name: str) -> Any:
    what, accepted, _ = VLLM_MISSING[name]
    return doc(f"vLLM's, taken only at {accepted}, which change nothing: {what}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How one request generates, with vLLM's names and meanings. Keyword-only; every field is checked
    when the object is made, and a bad value raises ValueError naming the field and what it accepts."""

    n: int = field(
        default=1,
        metadata=doc(
            f"Completions per prompt, 1 to {MAX_N}; completion i of a seeded request uses seed + i."
        ),
    )
    temperature: float = field(
        default=1.0,
        metadata=doc("Softmax temperature, >= 0; 0 is greedy. 1.0 by default, as in vLLM and OpenAI."),
    )
    top_p: float = field(
        default=1.0,
        metadata=doc(
            "Nucleus sampling: keep the smallest set of tokens whose mass reaches top_p, in (0, 1]."
        ),
    )
    top_k: int = field(default=0, metadata=doc("Keep the k most likely tokens; 0 or -1 turns it off."))
    min_p: float = field(
        default=0.0, metadata=doc("Drop tokens less likely than min_p times the most likely one, in [0, 1].")
    )
    seed: int | None = field(
        default=None,
        metadata=doc(
            "Per-request randomness, any int64 as in vLLM (a negative one taken mod 2**63); None derives "
            "one from the engine's seed."
        ),
    )
    max_tokens: int | None = field(
        default=16, metadata=doc("The most tokens to generate; None: until the sequence limit.")
    )
    min_tokens: int = field(
        default=0,
        metadata=doc(
            "EOS and stop_token_ids are banned until this many tokens are generated, except where a "
            "guided request's grammar has ended and allows nothing else: the grammar comes first."
        ),
    )
    stop: str | list[str] | None = field(
        default=None,
        metadata=doc(
            "Strings that end the completion, matched on the detokenized text, also across tokens "
            "(at most 128, of 16384 characters in all); a string or a list, kept as a list (as vLLM)."
        ),
    )
    stop_token_ids: list[int] | None = field(
        default=None, metadata=doc("Token ids that end the completion (kept in token_ids); None: none.")
    )
    include_stop_str_in_output: bool = field(
        default=False, metadata=doc("Keep the matched stop string at the end of the text.")
    )
    ignore_eos: bool = field(
        default=False, metadata=doc("Keep generating past the model's end-of-sequence tokens.")
    )
    presence_penalty: float = field(
        default=0.0,
        metadata=doc(
            "Subtracted from the logit of every token generated so far (OpenAI's definition), in [-2, 2]."
        ),
    )
    frequency_penalty: float = field(
        default=0.0,
        metadata=doc(
            "Subtracted once per occurrence of each token generated so far (OpenAI's definition), in [-2, 2]."
        ),
    )
    repetition_penalty: float = field(
        default=1.0,
        metadata=doc(
            "Divides positive and multiplies negative logits of prompt and generated tokens (HF's), in (0, 100]."
        ),
    )
    logit_bias: dict[int, float] | None = field(
        default=None,
        metadata=doc(
            f"Added to the logits of these token ids before penalties (vLLM's order), at most {MAX_BIASED}; "
            "a bias is finite, or -inf to ban the token, and a key may be the id's string, as OpenAI "
            "sends it (the server clamps biases to OpenAI's [-100, 100], as vLLM's does)."
        ),
    )
    allowed_token_ids: list[int] | None = field(
        default=None,
        metadata=doc(f"Only these token ids may be generated (at most {MAX_BIASED}); None: any."),
    )
    bad_words: list[str] | None = field(
        default=None,
        metadata=doc(
            f"Words never generated (at most {MAX_BIASED}), each as its tokens with and without a leading "
            "space, as vLLM tokenizes them. A word of one token is banned outright; a word of several "
            "tokens has its last token banned where the tokens generated last are its first ones, as "
            f"vLLM does (at most {WORD_SEQUENCES} such token sequences a request, {WORD_TOKENS} tokens "
            "each)."
        ),
    )
    logprobs: int | None = field(
        default=None,
        metadata=doc(
            f"Top-k logprobs per generated token, 0 to {MAX_LOGPROBS}, the chosen token always included; "
            "0 (or True): the chosen token only. Log-softmax of the model's logits before penalties and "
            "temperature; under guided decoding, after the grammar's mask (as in vLLM)."
        ),
    )
    prompt_logprobs: int | None = field(
        default=None, metadata=doc("The same for each prompt token (the first has none).")
    )
    truncate_prompt_tokens: int | None = field(
        default=None,
        metadata=doc(
            "Keep only the prompt's last k tokens (vLLM's); -1: as many as leave room for one more token "
            "under max_model_len. None: a prompt too long is refused."
        ),
    )
    skip_special_tokens: bool = field(default=True, metadata=doc("Leave special tokens out of the text."))
    spaces_between_special_tokens: bool = field(
        default=True, metadata=doc("Accepted for vLLM compatibility.")
    )
    detokenize: bool = field(
        default=True, metadata=doc("Produce text; False leaves text empty (token ids only).")
    )
    guided_decoding: GuidedDecodingParams | dict[str, Any] | None = field(
        default=None,
        metadata=doc("A structured-output constraint: GuidedDecodingParams or its dict."),
        compare=False,
    )
    structured_outputs: GuidedDecodingParams | dict[str, Any] | None = field(
        default=None, metadata=doc("Alias of guided_decoding (vLLM's newer name)."), compare=False
    )
    guided: dict[str, Any] | None = field(
        default=None,
        metadata=doc(
            "The runtime's own spelling: {'json_schema': ...}, {'json_object': True}, {'regex': ...}, "
            "{'choice': [...]} or {'grammar': ...}."
        ),
        hash=False,  # a dict: __hash__ leaves it to __eq__
    )

    # Inert: __post_init__ sets each back to its default.
    logits_processors: list[Any] | None = field(
        default=None, repr=False, compare=False, metadata=_vllm_doc("logits_processors")
    )
    best_of: int | None = field(default=None, repr=False, compare=False, metadata=_vllm_doc("best_of"))
    output_kind: Any = field(default=None, repr=False, compare=False, metadata=_vllm_doc("output_kind"))
    extra_args: dict[str, Any] | None = field(
        default=None, repr=False, compare=False, metadata=_vllm_doc("extra_args")
    )
    flat_logprobs: bool = field(default=False, repr=False, compare=False, metadata=_vllm_doc("flat_logprobs"))

    def __new__(cls, *args: Any, **kwargs: Any) -> SamplingParams:
        # A misspelt keyword gets the field it was meant to be, not only the dataclass's TypeError.
        names = cls.__dataclass_fields__
        for key, value in kwargs.items():
            if key in VLLM_MISSING and not VLLM_MISSING[key][2](value, kwargs):
                what, accepted, _ = VLLM_MISSING[key]
                raise TypeError(
                    f"SamplingParams({key}=...) is vLLM's, and fastpath does not have it: {what}; it takes "
                    f"{key}={accepted} only, which change nothing, and got {value!r}"
                )
            if key not in names:
                close = difflib.get_close_matches(key, list(names), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"SamplingParams() got an unexpected keyword argument {key!r}{hint}")
        return object.__new__(cls)

    def __post_init__(self) -> None:
        for name, default in _VLLM_DEFAULTS.items():  # __new__ took only values that change nothing
            object.__setattr__(self, name, default)
        for name in (*_INT_FIELDS, *_FLOAT_FIELDS):  # NumPy's numbers (a sweep's seeds, temperatures)
            v = getattr(self, name)
            plain = _plain(v)
            if name in _FLOAT_FIELDS and type(plain) is int:
                plain = float(plain)
            if plain is not v:
                object.__setattr__(self, name, plain)
        self._check_sampling()
        self._check_lengths()
        self._check_penalties()
        self._check_biases()
        self._check_logprobs()
        self._check_guided()
        for name in (
            "include_stop_str_in_output",
            "ignore_eos",
            "skip_special_tokens",
            "detokenize",
            "spaces_between_special_tokens",
        ):
            _check(isinstance(getattr(self, name), bool), name, "a bool", getattr(self, name))

    def _check_sampling(self) -> None:
        _check(_is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"an int in [1, {MAX_N}]", self.n)
        _check(
            _is_num(self.temperature) and self.temperature >= 0,
            "temperature",
            "a finite number >= 0",
            self.temperature,
        )
        if 0 < self.temperature < MIN_TEMPERATURE:
            # Logits divided by so small a number overflow to inf on the device, and the sample is
            # garbage; vLLM raises such a temperature to the same floor.
            _warn_once(
                f"SamplingParams.temperature {self.temperature} is below {MIN_TEMPERATURE}, which overflows "
                f"the logits; using {MIN_TEMPERATURE} (0 is greedy)"
            )
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        _check(_is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "a number in (0, 1]", self.top_p)
        _check(
            _is_int(self.top_k) and -1 <= self.top_k <= MAX_TOKEN_ID,
            "top_k",
            f"an int in [-1, {MAX_TOKEN_ID}] (0 or -1: off)",
            self.top_k,
        )
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        _check(_is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", "a number in [0, 1]", self.min_p)
        if self.seed is not None:
            _check(
                _is_int(self.seed) and -MAX_INT64 - 1 <= self.seed <= MAX_INT64,
                "seed",
                f"None or an int64, in [{-MAX_INT64 - 1}, {MAX_INT64}]",
                self.seed,
            )

    def _check_lengths(self) -> None:
        if self.truncate_prompt_tokens is not None:
            k = self.truncate_prompt_tokens
            _check(
                _is_int(k) and (k == -1 or 1 <= k <= MAX_TOKEN_ID),
                "truncate_prompt_tokens",
                f"None, -1 or an int in [1, {MAX_TOKEN_ID}]",
                k,
            )
        if self.max_tokens is not None:
            _check(
                _is_int(self.max_tokens) and 1 <= self.max_tokens <= MAX_TOKEN_ID,
                "max_tokens",
                f"None or an int in [1, {MAX_TOKEN_ID}]",
                self.max_tokens,
            )
        _check(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= MAX_TOKEN_ID,
            "min_tokens",
            f"an int in [0, {MAX_TOKEN_ID}]",
            self.min_tokens,
        )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if stop is not None:
            ok = isinstance(stop, (list, tuple)) and all(isinstance(s, str) and s for s in stop)
            _check(ok, "stop", "a non-empty string or a list of them", self.stop)
        chars = sum(map(len, stop)) if stop is not None else 0
        if stop is not None and (len(stop) > MAX_STOP_STRINGS or chars > MAX_STOP_CHARS):
            # Each is searched for after every token, on the thread that streams the text.
            raise ValueError(
                f"SamplingParams.stop must hold at most {MAX_STOP_STRINGS} strings of at most "
                f"{MAX_STOP_CHARS} characters in all, got {len(stop)} of {chars}"
            )
        if stop and self.detokenize is False:
            raise ValueError("SamplingParams.stop: stop strings are matched on text and need detokenize=True")
        # Lists, as vLLM stores them (a copy: the caller's list may change later).
        # Exact strs: a str subclass of the caller's __main__ cannot be rebuilt in the engine process.
        object.__setattr__(self, "stop", [str(s) for s in stop or ()])
        object.__setattr__(self, "stop_token_ids", _token_ids("stop_token_ids", self.stop_token_ids))

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(_is_num(v) and -2 <= v <= 2, name, "a number in [-2, 2]", v)
        v = self.repetition_penalty
        _check(_is_num(v) and 0 < v <= 100, "repetition_penalty", "a number in (0, 100]", v)

    def _check_biases(self) -> None:
        if self.logit_bias is not None:
            bias = self.logit_bias
            _check(isinstance(bias, dict), "logit_bias", "a dict of token id to bias", bias)
            _check(len(bias) <= MAX_BIASED, "logit_bias", f"at most {MAX_BIASED} entries", f"{len(bias)}")
            checked = {}
            for key, value in bias.items():
                token = int(key) if isinstance(key, str) and key.isdecimal() else _plain(key)
                value = _plain(value)
                _check(_is_int(token) and 0 <= token <= MAX_TOKEN_ID, "logit_bias",
                       f"keyed by token ids in [0, {MAX_TOKEN_ID}]", key)  # fmt: skip
                ok = _is_num(value) or value == -math.inf
                _check(ok, f"logit_bias[{token}]", "a finite number, or -inf (banned)", value)
                checked[token] = float(value)
            object.__setattr__(self, "logit_bias", checked)
        if self.allowed_token_ids is not None:
            ids = _token_ids("allowed_token_ids", self.allowed_token_ids)
            _check(
                0 < len(ids) <= MAX_BIASED, "allowed_token_ids", f"None or 1 to {MAX_BIASED} token ids", ids
            )
            object.__setattr__(self, "allowed_token_ids", ids)
        if self.bad_words is not None:
            words = self.bad_words
            ok = isinstance(words, (list, tuple)) and all(isinstance(w, str) and w.strip() for w in words)
            _check(ok, "bad_words", "a list of non-blank strings", words)
            _check(len(words) <= MAX_BIASED, "bad_words", f"at most {MAX_BIASED} words", f"{len(words)}")
            object.__setattr__(self, "bad_words", [str(w) for w in words])

    def _check_logprobs(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is True:
                v = 0  # the chosen token only: what `logprobs=True` meant before top-k existed
            elif v is False:
                v = None
            if v is not None:
                _check(
                    _is_int(v) and 0 <= v <= MAX_LOGPROBS, name, f"None or an int in [0, {MAX_LOGPROBS}]", v
                )
            object.__setattr__(self, name, v)

    def _check_guided(self) -> None:
        given = [(n, getattr(self, n)) for n in ("guided_decoding", "structured_outputs", "guided")]
        given = [(n, v) for n, v in given if v is not None]
        if len(given) > 1:
            raise ValueError(
                f"SamplingParams: {' and '.join(n for n, _ in given)} both set a constraint; set one"
            )
        if not given:
            return
        name, value = given[0]
        if name == "guided":
            _check(isinstance(value, dict), name, "a dict such as {'json_schema': {...}}", value)
            _parse_spec(value)
            return
        if isinstance(value, dict):
            try:
                value = GuidedDecodingParams(**value)
            except TypeError as exc:
                raise ValueError(f"SamplingParams.{name}: {exc}") from None
        _check(isinstance(value, GuidedDecodingParams), name, "a GuidedDecodingParams or its dict", value)
        spec = value.as_spec()
        _parse_spec(spec)
        object.__setattr__(self, "guided", spec)

    def __hash__(self) -> int:
        # What __eq__ compares, lists as tuples and logit_bias as its items; `guided` (a dict) only in
        # __eq__, which is allowed.
        hashed = (getattr(self, f.name) for f in fields(self) if (f.compare if f.hash is None else f.hash))
        return hash(tuple(_hashable(v) for v in hashed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def biased(self) -> bool:
        """Some token has a bias or a ban (logit_bias, allowed_token_ids, bad_words)."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None or bool(self.bad_words)

    def clone(self, **changes: Any) -> SamplingParams:
        """A copy, with `changes` (SamplingParams are frozen: `sp.clone(max_tokens=10)` where vLLM
        code would assign). The copy is checked as a new one is."""
        from dataclasses import replace

        guided = ("guided_decoding", "structured_outputs", "guided")
        given = [k for k in guided if k in changes]
        # The constraint lives on in `guided` (its spec); a new one replaces it.
        cleared = {k: None for k in guided if k not in given} if given else {k: None for k in guided[:2]}
        return replace(self, **{**cleared, **changes})

    @classmethod
    def from_optional(cls, **kwargs: Any) -> SamplingParams:
        """vLLM's: n, the penalties, temperature and top_p given as None take their defaults (as a
        JSON body's nulls would); any other None means what it means to SamplingParams itself."""
        return cls(**{k: v for k, v in kwargs.items() if v is not None or k not in _DEFAULTED_WHEN_NONE})

    def with_seed(self, seed: int) -> SamplingParams:
        """A copy for one of `n` completions."""
        from dataclasses import replace

        return replace(self, n=1, seed=seed, guided_decoding=None, structured_outputs=None)


def _refuse_assignment(self: SamplingParams, name: str, value: Any) -> None:
    # vLLM's SamplingParams is mutable and its examples assign to it; say what to do instead.
    instead = f"; use params.clone({name}=...) for a changed copy" if name in _FIELD_NAMES else ""
    raise FrozenInstanceError(
        f"cannot assign to SamplingParams.{name}: SamplingParams are immutable (the engine caches what "
        f"it derives from each one){instead}"
    )


_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))
_VLLM_DEFAULTS = {f.name: f.default for f in fields(SamplingParams) if f.name in VLLM_MISSING}
_DEFAULTED_WHEN_NONE = frozenset(
    {"n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p"}
)
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_INT_FIELDS = (
    "n",
    "top_k",
    "seed",
    "max_tokens",
    "min_tokens",
    "logprobs",
    "prompt_logprobs",
    "truncate_prompt_tokens",
)


SamplingParams.__setattr__ = _refuse_assignment  # type: ignore[method-assign, assignment]
