"""An OpenAI request's fields -> SamplingParams; a bad value is a RequestInvalid naming the request field.

SamplingParams checks every range once (engine/sampling_params.py) and names its own field; this
module maps that name back to what the client sent (`max_completion_tokens`, `top_logprobs`,
`response_format`, ...), so the 400 points at the client's key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engine.sampling_params import GuidedDecodingParams, SamplingParams
from .errors import RequestInvalid
from .protocol import ChatRequest, CompletionRequest, SamplingFields

# Fields a request may leave unset (None): the model's generation_config value, else SamplingParams'.
_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
_OWN_DEFAULTS = {name: SamplingParams.__dataclass_fields__[name].default for name in _DEFAULTED}
_FIELD = re.compile(r"SamplingParams\.(\w+)")
# Fields whose admission errors (engine/token_biases.py) start with their name.
MAX_BIAS = 100.0
_TOKEN_FIELDS = ("logit_bias", "allowed_token_ids", "bad_words")
_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


@dataclass(frozen=True, slots=True)
class RequestKeys:
    """The request keys that an engine admission error may blame (engine messages name their own)."""

    prompt: str  # "prompt" or "messages"
    max_tokens: str  # "max_tokens" or "max_completion_tokens"
    guided: str  # "response_format" or the guided_* key that set the constraint

    def blame(self, message: str) -> str:
        own = message.split(":", 1)[0].split(" ", 1)[0]
        if own in _TOKEN_FIELDS:
            return own
        if "max_tokens" in message:
            return self.max_tokens
        if "stop_token_ids" in message:
            return "stop_token_ids"
        if "guided" in message:
            return self.guided
        return self.prompt


def request_keys(req: SamplingFields, tool_schema: dict[str, Any] | None = None) -> RequestKeys:
    prompt = "messages" if isinstance(req, ChatRequest) else "prompt"
    return RequestKeys(prompt, _max_tokens(req)[0], _guided(req, tool_schema)[0])


def sampling_params(
    req: SamplingFields,
    max_tokens_limit: int | None,
    prompt_logprobs: int | None = None,
    defaults: Mapping[str, Any] | None = None,
    tool_schema: dict[str, Any] | None = None,
) -> SamplingParams:
    """The engine's SamplingParams for a completions or chat request; RequestInvalid names the field.
    `prompt_logprobs`: what an echoed prompt needs (a request's own `prompt_logprobs` adds to it).
    `defaults`: the model's own sampling values (the engine's `generation_defaults`), for what the
    request leaves unset, as in vLLM. `tool_schema`: the JSON schema a named or required tool call
    holds the output to (tool_calls.plan)."""
    d = {**_OWN_DEFAULTS, **(defaults or {})}
    unset = {name: d[name] if getattr(req, name) is None else getattr(req, name) for name in _DEFAULTED}
    max_key, max_tokens = _max_tokens(req)
    model_max = d.get("max_tokens")
    if max_key not in req.model_fields_set and model_max is not None:
        max_tokens = model_max if max_tokens is None else min(max_tokens, model_max)
    if max_tokens_limit is not None:
        if max_tokens is None:
            max_tokens = max_tokens_limit
        elif max_key not in req.model_fields_set:  # a default (completions' 16) fits under the limit
            max_tokens = min(max_tokens, max_tokens_limit)
        elif max_tokens > max_tokens_limit:
            raise RequestInvalid(
                f"{max_key} is {max_tokens}, above this server's limit of {max_tokens_limit}", max_key
            )
    logprob_key, logprobs = _logprobs(req)
    guided_key, guided = _guided(req, tool_schema)
    asked = req.prompt_logprobs
    if asked is not None:  # the request's own; with an echo's too, the larger top k serves both
        prompt_logprobs = asked if prompt_logprobs is None or asked < 0 else max(asked, prompt_logprobs)
    names = {
        "max_tokens": max_key,
        "logprobs": logprob_key,
        "prompt_logprobs": "prompt_logprobs" if asked is not None else logprob_key,
        "guided_decoding": guided_key,
    }
    try:
        return SamplingParams(
            n=req.n,
            **unset,
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids or (),
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logit_bias=_clamped(req.logit_bias),
            allowed_token_ids=req.allowed_token_ids,
            bad_words=req.bad_words,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
            guided_decoding=guided,
            truncate_prompt_tokens=req.truncate_prompt_tokens,
        )
    except (ValueError, TypeError) as exc:
        message = str(exc)
        match = _FIELD.search(message)
        guided_message = "Guided" in message or message.startswith("guided")
        field = match.group(1) if match else ("guided_decoding" if guided_message else None)
        param = names.get(field, field) if field else None
        raise RequestInvalid(_respell(message, field, param), param) from None


def _clamped(bias: dict[str, float] | None) -> dict[str, float] | None:
    """OpenAI's range for a bias, [-100, 100], as vLLM's server clamps to it (NaN stays, to be refused)."""
    return {k: min(MAX_BIAS, max(-MAX_BIAS, v)) for k, v in bias.items()} if bias else None


def _respell(message: str, field: str | None, param: str | None) -> str:
    """The engine's message in the client's words: `SamplingParams.top_p` -> `top_p`."""
    message = message.replace(f"SamplingParams.{field}", param or "") if field else message
    return message.replace("GuidedDecodingParams", param or "guided decoding")


def check_room(prompt_tokens: int, req: SamplingFields, max_seq_len: int) -> None:
    """An explicit max_tokens that the context cannot hold after this prompt (as truncate_prompt_tokens
    leaves it) is a 400, as in OpenAI's API and vLLM's server (the offline API caps it instead). A
    default is capped."""
    k = req.truncate_prompt_tokens
    if isinstance(k, int) and (k == -1 or k >= 1):  # a bad value is SamplingParams' to refuse
        prompt_tokens = min(prompt_tokens, max_seq_len - 1 if k == -1 else k)
    key, value = _max_tokens(req)
    if value is None or key not in req.model_fields_set or prompt_tokens >= max_seq_len:
        return  # a prompt that fills the context is the engine's to refuse, naming the prompt
    room = max_seq_len - prompt_tokens
    if value > room:
        raise RequestInvalid(
            f"{key} is too large: {value}. This model's context is {max_seq_len} tokens and the prompt "
            f"has {prompt_tokens} ({value} > {max_seq_len} - {prompt_tokens})",
            key,
        )


def _max_tokens(req: SamplingFields) -> tuple[str, int | None]:
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        return "max_completion_tokens", req.max_completion_tokens
    return "max_tokens", req.max_tokens


def _logprobs(req: SamplingFields) -> tuple[str, int | None]:
    if isinstance(req, CompletionRequest):
        return "logprobs", req.logprobs
    assert isinstance(req, ChatRequest)
    if not req.logprobs:
        return "logprobs", None
    return ("top_logprobs", req.top_logprobs) if req.top_logprobs is not None else ("logprobs", 0)


def _guided(
    req: SamplingFields, tool_schema: dict[str, Any] | None = None
) -> tuple[str, GuidedDecodingParams | None]:
    given: dict[str, dict[str, Any]] = {}
    if tool_schema is not None:  # blamed on tools: the schema is their parameters
        given["tools"] = {"json": tool_schema}
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        given["response_format"] = {"json_object": True}
    elif fmt is not None and fmt.type == "json_schema":
        assert fmt.json_schema is not None
        given["response_format"] = {"json": fmt.json_schema.json_schema or {"type": "object"}}
    for key, kind in zip(_GUIDED_FIELDS, ("json", "regex", "choice", "grammar"), strict=True):
        value = getattr(req, key)
        if value is not None:
            given[key] = {kind: value}
    if req.structured_outputs is not None:
        spec = req.structured_outputs.spec()
        if not spec:
            raise RequestInvalid("structured_outputs: sets no constraint", "structured_outputs")
        given["structured_outputs"] = spec
    if not given:
        return "response_format", None
    if len(given) > 1 and "tools" in given:
        other = next(k for k in given if k != "tools")
        raise RequestInvalid(
            f"{other}: a named or 'required' tool_choice already holds the output to the tools' schemas; "
            "set no other constraint",
            other,
        )
    if len(given) > 1:
        raise RequestInvalid(f"{' and '.join(given)} each set a constraint; set one", next(iter(given)))
    key, spec = next(iter(given.items()))
    options = {"backend": req.guided_decoding_backend, "whitespace_pattern": req.guided_whitespace_pattern}
    spec = {**{k: v for k, v in options.items() if v is not None}, **spec}
    try:
        return key, GuidedDecodingParams(**spec)
    except ValueError as exc:
        kind = next(iter(spec))
        message = str(exc).replace(f"GuidedDecodingParams.{kind}", key).replace("GuidedDecodingParams", key)
        raise RequestInvalid(message, key) from None
