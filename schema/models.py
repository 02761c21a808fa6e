"""Manifest v1: what a manifest may say. These models are the truth; DESIGN.md holds a sketch.

Every model is frozen and forbids unknown keys. Every field has a description and an API status
(`stable` or `prototype`), both exported into `manifest.schema.json`. Checks that span fields
raise `FieldError` with the path of the key to blame, so the loader can point at its line.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, field_validator, model_validator

from .errors import FieldError
from .fieldtypes import (
    AutoOrBool,
    BatchSizes,
    Checkpoint,
    EnvVarName,
    FmhaName,
    FmhaOrder,
    Host,
    ImportPath,
    NonNegativeInt,
    PackageName,
    PositiveInt,
    ServedModelName,
    bounds,
    spec,
)
from .names import (
    CATALOG_MODELS,
    DISPATCH_MODES,
    DISTRIBUTION,
    EXECUTOR_EVENTS,
    GUIDED_BACKENDS,
    LOOP_VS_GUIDED,
    ON_UNSUPPORTED,
    REASONING_PARSERS,
    SCHEMA_VERSION,
    TOOL_CALL_PARSERS,
)


class Section(BaseModel):
    # strict: a manifest says 8, not "8", and true, not 1. Tuples still accept YAML lists.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ModelSpec(Section):
    """The model to run: where its weights come from and in what precision."""

    checkpoint: Checkpoint = spec(
        doc="A Hugging Face model folder (config.json and *.safetensors); a catalog model by name "
        f"({', '.join(CATALOG_MODELS)}), whose weights ship in a package and are converted once into "
        "the cache (FASTPATH_CACHE, else ~/.cache/fastpath); or `random:<preset>` for seeded random "
        "weights in a known shape: tiny-llama, tiny-qwen2, tiny-qwen3, tiny-mistral, llama-1b. "
        "A relative folder is resolved against the working directory at run time; a folder named like "
        "a catalog model is written `./name`."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = spec(
        "float32", doc="Precision of weights and activations."
    )
    seed: int = spec(
        0,
        **bounds("seed"),
        doc="Seed of the random weights of a `random:` checkpoint; unused otherwise.",
    )


class CudaGraphsSpec(Section):
    """CUDA-graph capture of the decode step."""

    enabled: AutoOrBool = spec(
        "auto",
        doc="`auto` captures graphs when CUDA is present at run time; `true` requires it; `false` never does.",
    )
    batch_sizes: BatchSizes | None = spec(
        None,
        strict=False,
        doc="Batch sizes to capture, sorted and unique, none above `max_batch_size`. "
        "Unset: powers of two up to `max_batch_size`, and `max_batch_size` itself.",
    )


def _add_tp_alias(schema: dict[str, Any]) -> None:
    properties = schema["properties"]
    properties["tp"] = {
        **properties["tensor_parallel_size"],
        "description": "Alias of `tensor_parallel_size`.",
    }
    schema["not"] = {"required": ["tensor_parallel_size", "tp"]}


class RuntimeSpec(Section):
    """Where and how large the engine runs."""

    # `tp` is an alias; the schema lists it so that editors and check-jsonschema accept it too.
    model_config = ConfigDict(json_schema_extra=_add_tp_alias)

    device: Literal["auto", "cuda", "cpu"] = spec(
        "auto", doc="`auto` uses CUDA when it is present at run time."
    )
    max_batch_size: int = spec(
        16, **bounds("max_batch_size"), doc="The most sequences decoded together in one step."
    )
    max_seq_len: int = spec(
        2048, **bounds("max_seq_len"), doc="The longest sequence, prompt and output together."
    )
    cuda_graphs: CudaGraphsSpec = spec(CudaGraphsSpec(), doc="CUDA-graph capture of the decode step.")
    tensor_parallel_size: int = spec(
        1,
        **bounds("tensor_parallel_size"),
        status="prototype",
        validation_alias=AliasChoices("tensor_parallel_size", "tp"),
        doc="GPUs that split each layer. More than 1 needs CUDA.",
    )

    @model_validator(mode="after")
    def _fits_the_device(self) -> RuntimeSpec:
        if self.cuda_graphs.enabled is True and self.device == "cpu":
            raise FieldError(
                "true needs CUDA, but runtime.device is cpu; use enabled: auto (off on cpu) or false, "
                "or device: cuda or auto",
                ("cuda_graphs", "enabled"),
            )
        for i, size in enumerate(self.cuda_graphs.batch_sizes or ()):
            if size > self.max_batch_size:
                raise FieldError(
                    f"{size} is above max_batch_size {self.max_batch_size}: no step ever runs that many sequences",
                    ("cuda_graphs", "batch_sizes", i),
                )
        if self.tensor_parallel_size > 1 and self.device == "cpu":
            raise FieldError(
                f"{self.tensor_parallel_size} needs CUDA, but runtime.device is cpu",
                ("tensor_parallel_size",),
            )
        return self


class ExecutorEventsSpec(Section):
    """Callables the executor runs at fixed points of its life, each an import path `pkg.module:Name`."""

    after_warmup: tuple[ImportPath, ...] = spec(
        (),
        strict=False,
        unique=True,
        status="prototype",
        doc="Run after warmup and graph capture, inside the warmup guard; an exception aborts start-up.",
    )
    before_overlap_loop: tuple[ImportPath, ...] = spec(
        (),
        strict=False,
        unique=True,
        status="prototype",
        doc="Run once, before the overlap loop enters its stream scope.",
    )
    at_shutdown: tuple[ImportPath, ...] = spec(
        (), strict=False, unique=True, status="prototype", doc="Run at shutdown, also after an error."
    )

    @model_validator(mode="after")
    def _each_once(self) -> ExecutorEventsSpec:
        for event in EXECUTOR_EVENTS:
            paths = getattr(self, event)
            for i, path in enumerate(paths):
                if path in paths[:i]:
                    raise FieldError(f"{path!r} is already listed at index {paths.index(path)}", (event, i))
        return self


class HooksSpec(Section):
    """Engine fast paths, after TensorRT-LLM's RuntimeHooks. Every hook is off unless declared here."""

    loop_on_execution_stream: bool = spec(
        False,
        status="prototype",
        doc="Run the overlap loop with the execution stream current, so loop work and the forward are ordered "
        "on one stream and cross-stream waits are skipped. A no-op without CUDA.",
    )
    decode_prologue: ImportPath | None = spec(
        None,
        status="prototype",
        doc="A DecodePrologue, as `pkg.module:Name`, called each decode step to run the input prologue as one "
        "launch; it returns False to let the native prologue run instead.",
    )
    executor_events: ExecutorEventsSpec = spec(
        ExecutorEventsSpec(), status="prototype", doc="Callables run at fixed points of the executor's life."
    )


class HostDispatchSpec(Section):
    """How host callbacks are launched from CUDA streams. Without CUDA they run inline, in order."""

    mode: Literal[DISPATCH_MODES] = spec(
        "auto",
        status="prototype",
        doc="`blocking`: cudaLaunchHostFunc. `spin`: low latency, cudaLaunchHostFunc_v2 with spin-wait on "
        "CUDA 13.2+, else a doorbell in mapped memory, else blocking. `auto`: the same chain, silently.",
    )
    on_unsupported: Literal[ON_UNSUPPORTED] = spec(
        "warn_once",
        status="prototype",
        doc="What `spin` does when it must fall back to blocking: warn once per process, or raise.",
    )


class FmhaSpec(Section):
    """Attention (FMHA) library precedence: the first available library that supports a call runs it."""

    prepend: tuple[FmhaName, ...] = spec(
        (), strict=False, unique=True, doc="Libraries tried before the enabled ones, in order."
    )
    enabled: FmhaOrder | None = spec(
        None,
        strict=False,
        unique=True,
        doc="Libraries tried after `prepend`, in order, at least one. Unset: the runtime's default order.",
    )

    @model_validator(mode="after")
    def _each_once(self) -> FmhaSpec:
        seen: dict[str, str] = {}
        for key in ("prepend", "enabled"):
            for i, name in enumerate(getattr(self, key) or ()):
                if name in seen:
                    raise FieldError(
                        f"{name!r} is already in {seen[name]}; each library has one place in the order",
                        (key, i),
                    )
                seen[name] = key
        return self


class GuidedDecodingSpec(Section):
    """Constrained decoding (JSON schema, grammar) by a guided-decoding backend."""

    backend: Literal[GUIDED_BACKENDS] = spec("none", doc="The backend, or `none`.")


class ServeSpec(Section):
    """The OpenAI-compatible HTTP server (`fastpath serve MANIFEST`, `python -m <package> serve`): its defaults,
    which command-line flags override."""

    host: Host = spec("127.0.0.1", doc="The address to listen on; loopback unless set.")
    port: PositiveInt = spec(8000, le=65535, doc="The TCP port.")
    served_model_name: ServedModelName | None = spec(
        None, doc="The model name `/v1/models` lists and requests name. Unset: the manifest's name."
    )
    api_key_env: EnvVarName | None = spec(
        None,
        doc="The environment variable holding the API key clients must send as a bearer token. "
        "Unset: FASTPATH_API_KEY; no key set there (nor --api-key) means no auth.",
    )
    max_queued_requests: NonNegativeInt = spec(
        1024, le=1 << 20, doc="Completions that may wait beyond a full batch; more are refused with 503."
    )
    max_tokens: PositiveInt | None = spec(
        None,
        le=1 << 20,
        doc="The most tokens one request may ask for, and what it gets when it asks for none. "
        "Unset: up to the sequence limit.",
    )
    max_request_bytes: PositiveInt = spec(
        8 << 20, ge=1024, le=1 << 30, doc="A larger request body is refused with 413."
    )
    drain_timeout_s: float = spec(
        30.0,
        ge=0,
        le=3600,
        doc="After SIGTERM, seconds running requests may take to finish before they are cut; then it exits 0.",
    )
    stream_interval: PositiveInt = spec(
        1,
        le=64,
        doc="Tokens a streamed event gathers before it is sent (the first token and the end go at once); "
        "more cost the server less CPU per token under heavy load.",
    )
    api_server_count: PositiveInt = spec(
        1,
        le=64,
        doc="Processes serving HTTP in front of the one engine process, for more streamed tokens a second "
        "than one Python process sends; the admission bounds are shared out among them.",
    )
    enable_auto_tool_choice: bool = spec(
        False,
        doc="Chat requests with tools may leave the choice to the model (tool_choice `auto`), whose calls "
        "are read out of its text in `tool_call_parser`'s format (vLLM's --enable-auto-tool-choice). A "
        "named tool and `required` work without it.",
    )
    tool_call_parser: Literal[TOOL_CALL_PARSERS] | None = spec(
        None,
        doc="The format the model writes tool calls in: `hermes` (Hermes, Qwen2.5/3), `llama3_json` "
        "(Llama 3.1/3.2's JSON template) or `pythonic` (Llama 3.2's and Llama 4's pythonic templates; `llama4_pythonic` is the same).",
    )
    reasoning_parser: Literal[REASONING_PARSERS] | None = spec(
        None,
        doc="Send a reasoning model's thinking as `reasoning`, apart from its content: `deepseek_r1` "
        "(DeepSeek R1, QwQ, templates that open <think> in the prompt) or `qwen3`.",
    )

    @model_validator(mode="after")
    def _auto_needs_a_parser(self) -> ServeSpec:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise FieldError(
                f"needs tool_call_parser ({', '.join(TOOL_CALL_PARSERS)}): the format the model writes "
                "its calls in",
                ("enable_auto_tool_choice",),
            )
        return self


class Manifest(Section):
    """A fastpath manifest, version 1: one model deployment and the fast paths it opts into."""

    schema_version: Literal[1] = spec(doc="The manifest format version; this fastpath reads version 1.")
    name: PackageName = spec(
        doc="The package name: lower-case letters, digits, '-' and '_', starting with a letter. "
        "The Python package is the name with '-' as '_'."
    )
    model: ModelSpec = spec(doc="The model to run.")
    runtime: RuntimeSpec = spec(RuntimeSpec(), doc="Where and how large the engine runs.")
    hooks: HooksSpec = spec(
        HooksSpec(), status="prototype", doc="Engine fast paths; all off unless declared."
    )
    host_dispatch: HostDispatchSpec = spec(HostDispatchSpec(), doc="How host callbacks are launched.")
    fmha: FmhaSpec = spec(FmhaSpec(), doc="Attention library precedence.")
    guided_decoding: GuidedDecodingSpec = spec(GuidedDecodingSpec(), doc="Constrained decoding.")
    serve: ServeSpec = spec(ServeSpec(), doc="The HTTP server's defaults.")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _known_version(cls, value: Any) -> Any:
        if type(value) is int and value > SCHEMA_VERSION:
            raise ValueError(
                f"{value} is newer than this fastpath understands (it reads schema_version {SCHEMA_VERSION}); "
                f"upgrade it: pip install --upgrade {DISTRIBUTION}"
            )
        if isinstance(value, str) and value.strip() == str(SCHEMA_VERSION):
            raise ValueError(
                f"{value!r} is a string: write the number, schema_version: {SCHEMA_VERSION} (no quotes)"
            )
        if type(value) is not int or value != SCHEMA_VERSION:
            raise ValueError(
                f"{value!r} is not supported; this fastpath reads schema_version {SCHEMA_VERSION}"
            )
        return value

    @model_validator(mode="after")
    def _hooks_fit_guided_decoding(self) -> Manifest:
        if self.hooks.loop_on_execution_stream and self.guided_decoding.backend != "none":
            raise FieldError(
                f"cannot be combined with guided_decoding ({self.guided_decoding.backend}): {LOOP_VS_GUIDED}; "
                "turn one of them off",
                ("hooks", "loop_on_execution_stream"),
            )
        return self
