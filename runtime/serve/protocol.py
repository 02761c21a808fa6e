"""The OpenAI request bodies the server accepts, as pydantic models (vLLM's extras included).

Types are checked here, strictly (`"8"` is not 8, `1` is not `true`); value ranges are checked once,
by SamplingParams (params.py), and both kinds of error name the request field.

Unknown fields: one that is close to a known field is a misspelling and refused with a suggestion, so
a misspelt option never silently does nothing; any other is ignored and logged once, as vLLM does, so
clients that send newer OpenAI fields (`store`, `metadata`, ...) keep working.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..engine.chat_kwargs import check_template_kwargs

TokenIds = list[Annotated[int, Field(ge=0)]]


_log = logging.getLogger("fastpath.serve")
_MAX_SPELL_CHECKS = 32  # unknown keys checked for misspelling; the rest are ignored unchecked
_ignored_logged: set[str] = set()
_KNOWN: dict[type, frozenset[str]] = {}


class FieldError(ValueError):
    """A check across fields that blames one of them (the 400's `param`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


def misspelling_of(name: str, known: Any) -> str | None:
    """The known field `name` is most likely a misspelling of, if any."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
    return close[0] if close else None


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    # Fields whose null is a value of its own rather than "the default".
    null_is_a_value: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_means_the_default(cls, data: Any) -> Any:
        # OpenAI's spec marks its optional fields nullable and clients send explicit nulls: a null
        # takes the field's default (a required field stays required).
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        known = cls._known_keys()
        out = {}
        checks = 0
        for k, v in data.items():
            if k not in known:
                # A field of another route (chat's top_logprobs sent to completions) is no misspelling:
                # ignored, as vLLM ignores it. Bounded: a body of 500k unknown keys must not hold the
                # event loop in difflib.
                checks += 1
                if k in every_key() or checks > _MAX_SPELL_CHECKS or misspelling_of(k, known) is None:
                    cls._ignore(k)
                    continue
            default_for_null = (
                v is None
                and k in fields
                and k not in cls.null_is_a_value
                and not fields[k].is_required()
                and fields[k].get_default() is not None
            )
            if not default_for_null:
                out[k] = v
        return out

    @classmethod
    def _known_keys(cls) -> frozenset[str]:
        keys = _KNOWN.get(cls)
        if keys is None:  # once per model class, not per request
            aliases = {f.alias for f in cls.model_fields.values() if f.alias}
            for f in cls.model_fields.values():
                if isinstance(f.validation_alias, AliasChoices):
                    aliases |= {c for c in f.validation_alias.choices if isinstance(c, str)}
            keys = _KNOWN[cls] = frozenset(cls.model_fields) | aliases
        return keys

    @classmethod
    def _ignore(cls, key: str) -> None:
        name = f"{cls.__name__}.{key}"
        if name not in _ignored_logged and len(_ignored_logged) < 256:  # bounded: keys come from clients
            _ignored_logged.add(name)
            _log.warning(
                "ignoring the request field %r of %s: this server does not use it", key, cls.__name__
            )


@functools.cache  # first called by a request, once every body class exists
def every_key() -> frozenset[str]:
    """Every field (and alias) of every request body this server reads."""
    keys: set[str] = set()
    stack = list(Body.__subclasses__())
    while stack:
        cls = stack.pop()
        keys |= cls._known_keys()
        stack += cls.__subclasses__()
    return frozenset(keys)


def _template_variables(cls: type, value: Any) -> Any:
    check_template_kwargs(value)
    return value


# chat_template_kwargs carry template variables only: one validator, on every body that has them.
_TEMPLATE_VARIABLES_ONLY = field_validator("chat_template_kwargs")(classmethod(_template_variables))


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchema(Body):
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a json_schema object")
        return self


class StructuredOutputs(Body):
    """vLLM's `structured_outputs` (the newer spelling of its guided_* fields): one constraint."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")  # not BaseModel.json
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    # Options, with GuidedDecodingParams' meanings.
    backend: str | None = None
    disable_any_whitespace: bool | None = None
    whitespace_pattern: str | None = None
    disable_additional_properties: bool | None = None
    disable_fallback: bool | None = None

    def spec(self) -> dict[str, Any]:
        """GuidedDecodingParams' keywords; json_object false sets no constraint."""
        given = self.model_dump(exclude_none=True, by_alias=True)
        return {k: v for k, v in given.items() if not (k == "json_object" and v is False)}


class SamplingFields(Body):
    """The fields completions and chat share: OpenAI's, then vLLM's extras."""

    model: str | None = None
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None  # None: 1.0, as OpenAI
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    # vLLM's extras
    allowed_token_ids: TokenIds | None = None
    bad_words: list[str] | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: TokenIds | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's older options for whichever constraint the request sets
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    structured_outputs: StructuredOutputs | None = None
    return_token_ids: bool = False  # each choice carries its token ids, the response the prompt's
    # vLLM's: logprobs spell each token "token_id:<id>", which a text cannot (bytes of a character).
    return_tokens_as_token_ids: bool | None = None  # None: the server's --return-tokens-as-token-ids
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and its top k (rank, text)
    cache_salt: str | None = None  # vLLM's: the prompt finds cached KV only of prompts with this salt
    truncate_prompt_tokens: int | None = None  # keep the prompt's last k tokens (-1: what fits)
    use_beam_search: bool = False  # vLLM's: n beams, the n best returned (serve/beam.py)
    length_penalty: float = 1.0  # beam search's score: cumulative logprob / length ** length_penalty

    @field_validator("stream_options")
    @classmethod
    def _options_need_a_stream(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise ValueError("needs stream: true")
        return value

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs_not_streamed(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("stream"):  # as vLLM: they would come after the text
            if value == 0:  # vLLM takes 0 with a stream, and streams no prompt logprobs
                return None
            raise ValueError("is not available with stream: true (except 0)")
        return value

    @field_validator("cache_salt")
    @classmethod
    def _salt_not_empty(cls, value: Any) -> Any:
        if value is not None and not value:
            raise ValueError("must be a non-empty string")
        return value


class CompletionRequest(SamplingFields):
    # An explicit null max_tokens is the rest of the context, as in vLLM; absent, OpenAI's 16.
    null_is_a_value: ClassVar[frozenset[str]] = frozenset({"max_tokens"})

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = 16  # OpenAI's default for completions (chat's is the rest of the context)
    add_special_tokens: bool = True  # vLLM's: the tokenizer's BOS and the like, for a text prompt
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("is an empty list")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and value != info.data.get("n"):
            raise ValueError("other than n is not supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        if value:
            raise ValueError("is not supported")
        return value


class TextPart(Body):
    """A text part; or an assistant reply's refusal, as OpenAI returns it and clients send it back."""

    type: Literal["text", "refusal"]
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _its_own_field(self) -> TextPart:
        if getattr(self, self.type) is None:
            raise FieldError(self.type, f"a {self.type!r} part needs its {self.type!r} string")
        return self

    def as_text(self) -> str:
        return self.text if self.type == "text" else self.refusal


class ChatMessage(Body):
    # "function" is OpenAI's deprecated spelling of a tool result, which clients still send.
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    # What a client sends back of an earlier reply, and what tool results carry: templates read
    # tool_calls and tool_call_id; the rest is accepted and not used.
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None

    def as_template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.as_text() for part in content)  # as vLLM joins them
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        for key in ("name", "tool_call_id"):
            value = getattr(self, key)
            if value is not None:
                message[key] = value
        if self.tool_calls is not None:
            message["tool_calls"] = [_call_for_template(c) for c in self.tool_calls]
        return message


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    """An earlier reply's tool call with its arguments as an object, as HF chat templates read them
    (`arguments | tojson`) and vLLM passes them; OpenAI sends them as JSON text."""
    function = call.get("function")
    if not isinstance(function, dict):
        return call
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):  # deep nesting is the client's too
            return call  # not JSON: the template gets the text as sent
    elif arguments is None:
        arguments = {}
    return {**call, "function": {**function, "arguments": arguments}}


class FunctionDefinition(Body):
    # Looser than OpenAI's [A-Za-z0-9_-]{1,64}, as vLLM is (MCP tools go by "server.tool"); it only
    # reaches generated code as a JSON string.
    name: str = Field(pattern=r"^\S{1,256}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema; none: no arguments
    strict: bool | None = None  # OpenAI's; named and required calls are always held to the schema here


class ChatTool(Body):
    type: Literal["function"] = "function"  # vLLM's default
    function: FunctionDefinition

    def as_template_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name; it wins where both are sent, as in vLLM
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    add_special_tokens: bool = False  # vLLM's: the chat template places BOS itself
    include_reasoning: bool = True  # vLLM's: with a reasoning parser, whether the reply carries it
    # vLLM's chat extras
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False  # vLLM's: the reply starts with the last message's text when it has the reply's role

    _template_variables_only = _TEMPLATE_VARIABLES_ONLY

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return value

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ChatRequest:
        # Whether "auto" may run is the server's setting (tool_calls.plan); what needs no server is here.
        choice, tools = self.tool_choice, self.tools or []
        if choice is None or choice == "none":
            return self
        if self.tools == [] and choice in ("auto", "required"):
            # vLLM's: an empty tool list calls nothing (agent clients build it per turn).
            self.tool_choice, self.tools = "none", None
            return self
        if not tools:
            what = repr(choice) if isinstance(choice, str) else "a named tool"
            raise FieldError("tool_choice", f"{what} needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {
            t.function.name for t in tools
        }:
            raise FieldError("tool_choice", f"names {choice.function.name!r}, which is not one of the tools")
        return self

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.as_template_dict() for t in self.tools] if self.tools else None

    @field_validator("continue_final_message")
    @classmethod
    def _continue_without_prompt(cls, value: Any, info: ValidationInfo) -> Any:
        if value and info.data.get("add_generation_prompt"):
            raise ValueError("needs add_generation_prompt: false")
        return value

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.as_template_dict() for m in self.messages]


class TokenizeRequest(Body):
    """vLLM's /tokenize: a prompt, or a conversation rendered by the chat template (not both)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool | None = None  # default: a prompt's yes, a chat's no (its template places them)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None  # rendered as chat renders them, so the counts agree
    return_token_strs: bool = False

    _template_variables_only = _TEMPLATE_VARIABLES_ONLY

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give prompt or messages, one of them")
        return self


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: TokenIds


class ResponseInputText(Body):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None  # an earlier reply's, sent back; not used


class ResponseInputMessage(Body):
    """A message item of OpenAI's Responses input (images are not taken)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ResponseInputText]
    id: str | None = None  # an earlier reply's, sent back; not used
    status: str | None = None


class ResponseFunctionCall(Body):
    """An earlier reply's function call, sent back with its output (a chat's assistant tool call)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None  # the item's, not used
    status: str | None = None


class ResponseFunctionCallOutput(Body):
    """A function call's result (a chat's tool message)."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ResponseInputText]
    id: str | None = None
    status: str | None = None


class ResponseFunctionTool(Body):
    """A function tool in the Responses API's flat shape ({"type": "function", "name": ...}): chat's
    FunctionDefinition with the type beside it. Its own class, so a wrong type is the error named first."""

    type: Literal["function"] = "function"
    name: str = Field(pattern=r"^\S{1,256}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseNamedTool(Body):
    type: Literal["function"] = "function"
    name: str


class ResponseReasoningText(Body):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ResponseReasoning(Body):
    """An earlier reply's reasoning, sent back as agents send a whole reply back: taken and left out of
    the prompt, as chat templates leave out earlier turns' thinking."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ResponseReasoningText] = Field(default_factory=list)
    content: list[ResponseReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    @field_validator("encrypted_content")
    @classmethod
    def _readable(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("encrypted reasoning is another server's; this one cannot read it")
        return value


# An input item's type -> its model. The tags are the class names, which a 400's param leaves out.
_ITEM_MODELS = {"message": "ResponseInputMessage", "function_call": "ResponseFunctionCall",
                "function_call_output": "ResponseFunctionCallOutput", "reasoning": "ResponseReasoning"}  # fmt: skip


def _item_type(value: Any) -> str | None:
    # A message may leave its type out (OpenAI's EasyInputMessage).
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return _ITEM_MODELS.get(kind) if isinstance(kind, str) else None


ResponseInputItem = Annotated[
    Annotated[ResponseInputMessage, Tag("ResponseInputMessage")]
    | Annotated[ResponseFunctionCall, Tag("ResponseFunctionCall")]
    | Annotated[ResponseFunctionCallOutput, Tag("ResponseFunctionCallOutput")]
    | Annotated[ResponseReasoning, Tag("ResponseReasoning")],
    Discriminator(
        _item_type,
        custom_error_type="input_item",
        custom_error_message="items of this type are not taken: message, function_call, "
        "function_call_output and reasoning are",
    ),
]


class ResponsesRequest(Body):
    """OpenAI's /v1/responses, as vLLM serves it without storage: messages and function calls in, a
    message and function calls out."""

    model: str | None = None
    input: str | list[ResponseInputItem] = Field(...)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool = False
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    tools: list[ResponseFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponseNamedTool | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    # What needs stored state or prompt templates: refused by name when set.
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    # vLLM's sampling extras, as its /v1/responses takes them
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    cache_salt: str | None = None  # as chat's

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("input must hold at least one message")
        return value


class LoadLoRAAdapterRequest(Body):
    """vLLM's /v1/load_lora_adapter."""

    lora_name: str = Field(..., min_length=1)
    lora_path: str = Field(..., min_length=1)
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(Body):
    """vLLM's /v1/unload_lora_adapter."""

    lora_name: str = Field(..., min_length=1)
    lora_int_id: int | None = None  # vLLM's, which it ignores once a name is given; so does this


class ScoreRequest(Body):
    """vLLM's /score: text_1 scored against each of text_2 (one text_1), or pair by pair (two lists of
    one length). Newer vLLM's names for the two are taken too: data_1 and data_2, queries and
    documents (or items)."""

    model: str | None = None
    text_1: str | list[str] = Field(..., validation_alias=AliasChoices("text_1", "data_1", "queries"))
    text_2: str | list[str] = Field(
        ..., validation_alias=AliasChoices("text_2", "data_2", "documents", "items")
    )
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    user: str | None = None

    @field_validator("text_1", "text_2")
    @classmethod
    def _not_empty(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError(f"{info.field_name} must hold at least one text")
        return value


class RerankRequest(Body):
    """vLLM's /rerank (Jina's and Cohere's shape): the documents, most relevant to the query first."""

    model: str | None = None
    query: str = Field(...)
    documents: list[str] = Field(...)
    top_n: int = 0  # vLLM's: every document unless positive
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    user: str | None = None

    @field_validator("documents")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if not value:
            raise ValueError("documents must hold at least one text")
        return value


class EmbeddingRequest(Body):
    """OpenAI's /v1/embeddings (vLLM's extras: truncate_prompt_tokens, normalize), or vLLM's chat form:
    `messages` rendered by the chat template, one input."""

    model: str | None = None
    input: str | list[str] | TokenIds | list[TokenIds] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    normalize: bool | None = None
    # vLLM's chat form; its defaults are vLLM's for embeddings (no generation prompt to embed).
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("input must hold at least one text or token list")
        return value

    _template_variables_only = _TEMPLATE_VARIABLES_ONLY

    @model_validator(mode="after")
    def _input_or_messages(self) -> EmbeddingRequest:
        if self.input is None and self.messages is None:
            raise FieldError("input", "Field required (or vLLM's chat form: messages)")
        if self.input is not None and self.messages is not None:
            raise FieldError("messages", "give input or messages, one of them")
        return self
