"""The Plan: a manifest with every default filled and every decision made, each with its reason.

Everything downstream (render, --explain, the lock file, the runtime) reads the Plan and
never the manifest, so a default or a gate is decided in exactly one place: `resolve`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLM_KWARGS = (
    "model",
    "dtype",
    "device",
    "max_batch_size",
    "max_seq_len",
    "cuda_graphs",
    "graph_batch_sizes",
    "fmha_prepend",
    "fmha_enabled",
    "dispatch_mode",
    "on_unsupported",
    "guided_backend",
    "tensor_parallel_size",
    "seed",
)
# A generated package's extension fixes these at compile time, so its LLM never passes them.
COMPILED_IN = ("dispatch_mode", "on_unsupported")


@dataclass(frozen=True, slots=True)
class HookRef:
    """A hook's import path, split into a module path and an attribute, both validated identifiers."""

    module: str
    attr: str
    line: int | None  # where the manifest declares it

    @property
    def path(self) -> str:
        return f"{self.module}:{self.attr}"


@dataclass(frozen=True, slots=True)
class HookPlan:
    loop_on_execution_stream: bool
    decode_prologue: HookRef | None
    after_warmup: tuple[HookRef, ...]
    before_overlap_loop: tuple[HookRef, ...]
    at_shutdown: tuple[HookRef, ...]

    def executor_events(self) -> dict[str, tuple[HookRef, ...]]:
        return {
            "after_warmup": self.after_warmup,
            "before_overlap_loop": self.before_overlap_loop,
            "at_shutdown": self.at_shutdown,
        }

    def declared(self) -> dict[str, Any]:
        """Only the hooks that are on, in as_dict's shape: a hook left off is not named at all."""
        events = {event: paths for event, paths in self.as_dict()["executor_events"].items() if paths}
        result: dict[str, Any] = {}
        if self.loop_on_execution_stream:
            result["loop_on_execution_stream"] = True
        if self.decode_prologue:
            result["decode_prologue"] = self.decode_prologue.path
        if events:
            result["executor_events"] = events
        return result

    def sites(self, manifest_path: str) -> dict[str, Any]:
        """Where the manifest declares each hook ("path:line"), in as_dict's shape, for HookSites."""

        def site(ref: HookRef) -> str:
            return f"{manifest_path}:{ref.line}" if ref.line is not None else manifest_path

        return {
            "decode_prologue": site(self.decode_prologue) if self.decode_prologue else None,
            "executor_events": {
                event: [site(h) for h in refs] for event, refs in self.executor_events().items()
            },
        }

    def as_dict(self) -> dict[str, Any]:
        """Plain data for `fastpath.runtime.hooks.hooks_from_lock`."""
        return {
            "loop_on_execution_stream": self.loop_on_execution_stream,
            "decode_prologue": self.decode_prologue.path if self.decode_prologue else None,
            "executor_events": {
                event: [h.path for h in refs] for event, refs in self.executor_events().items()
            },
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """One decided gate: `subject` is `value` because `reason`."""

    subject: str
    value: str
    reason: str


@dataclass(frozen=True, slots=True)
class ServePlan:
    """The HTTP server's defaults (the manifest's `serve:` section), the model's name filled in."""

    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key_env: str | None = None  # None: the server's default variable
    max_queued_requests: int = 1024
    max_tokens: int | None = None
    max_request_bytes: int = 8 << 20
    drain_timeout_s: float = 30.0
    stream_interval: int = 1
    api_server_count: int = 1
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "served_model_name": self.served_model_name,
            "api_key_env": self.api_key_env,
            "max_queued_requests": self.max_queued_requests,
            "max_tokens": self.max_tokens,
            "max_request_bytes": self.max_request_bytes,
            "drain_timeout_s": self.drain_timeout_s,
            "stream_interval": self.stream_interval,
            "api_server_count": self.api_server_count,
            "enable_auto_tool_choice": self.enable_auto_tool_choice,
            "tool_call_parser": self.tool_call_parser,
            "reasoning_parser": self.reasoning_parser,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    package: str  # the Python import name
    distribution: str  # the wheel's name
    manifest_path: str  # as the generated files name it: relative to the repository, or as given
    manifest_sha256: str

    model: str
    dtype: str
    seed: int
    device: str
    max_batch_size: int
    max_seq_len: int
    tensor_parallel_size: int
    cuda_graphs: bool | None  # None: on when CUDA is present at run time
    graph_batch_sizes: tuple[int, ...] | None  # None when graphs are off
    guided_backend: str

    hooks: HookPlan
    dispatch_mode: str
    on_unsupported: str
    dispatch_chain: tuple[str, ...]  # backends tried in order when CUDA is present; inline without it
    fmha_prepend: tuple[str, ...]
    fmha_enabled: tuple[str, ...] | None  # None: the runtime's default order
    fmha_order: tuple[str, ...]  # the order the runtime will try

    decisions: tuple[Decision, ...]
    serve: ServePlan | None = None  # None only for a Plan built by hand: resolve() always fills it

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `fastpath.runtime.LLM(...)`, as plain values. Hooks travel separately."""
        return {key: getattr(self, key) for key in LLM_KWARGS}

    def package_defaults(self) -> dict[str, Any]:
        """A generated package's LLM defaults: llm_kwargs without what its extension compiles in."""
        return {key: value for key, value in self.llm_kwargs().items() if key not in COMPILED_IN}

    def hooks_dict(self) -> dict[str, Any]:
        """The hooks as plain data, for `fastpath.runtime.hooks.hooks_from_lock`."""
        return self.hooks.as_dict()

    def to_json(self) -> dict[str, Any]:
        """The content of manifest.lock.json (without its @generated marker)."""
        return {
            "schema_version": 1,
            "name": self.name,
            "package": self.package,
            "distribution": self.distribution,
            "manifest": {"path": self.manifest_path, "sha256": self.manifest_sha256},
            "llm_kwargs": self.llm_kwargs(),
            "hooks": self.hooks_dict(),
            "hook_sites": self.hooks.sites(self.manifest_path),
            "dispatch_chain": list(self.dispatch_chain),
            "fmha_order": list(self.fmha_order),
            "decisions": [
                {"subject": d.subject, "value": d.value, "reason": d.reason} for d in self.decisions
            ],
            "serve": (self.serve or ServePlan(self.name)).as_dict(),
        }
