"""resolve: a validated manifest -> the Plan. The only place a default is filled or a gate decided."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastpath.schema.errors import Diagnostic, ManifestError
from fastpath.schema.fieldtypes import python_package, split_import_path
from fastpath.schema.loader import LoadedManifest
from fastpath.vocab import (
    ALLOW_LONG_ENV,
    CATALOG_POSITIONS,
    CATALOG_SPLITS,
    DEFAULT_FMHA_ORDER,
    DISPATCH_CHAINS,
    LOOP_VS_GUIDED,
    RANDOM_PREFIX,
    RANDOM_PRESET_POSITIONS,
    RANDOM_PRESET_SPLITS,
    default_graph_batch_sizes,
    tensor_parallel_problems,
)

from . import hook_calls, hook_lookup
from .plan import Decision, HookPlan, HookRef, Plan, ServePlan


def resolve(loaded: LoadedManifest, manifest_path: str | None = None) -> Plan:
    """`manifest_path` is how generated files name the manifest; it defaults to the file as given."""
    m = loaded.manifest
    manifest_path = manifest_path or loaded.filename
    if not manifest_path.isprintable():
        # It goes into a one-line comment of every generated file: a newline would end the comment.
        raise ManifestError.at(loaded.filename, 1, 1, f"the manifest's path {manifest_path!r} is unprintable")
    _check_context_length(loaded)
    hooks = _hooks(loaded)
    cuda_graphs, graph_sizes, graph_reason = _cuda_graphs(loaded)
    fmha_order, fmha_reason = _fmha_order(loaded)
    chain = DISPATCH_CHAINS[m.host_dispatch.mode]

    decisions = [
        *_hook_decisions(loaded, hooks),
        Decision("cuda_graphs", _on_off_auto(cuda_graphs), graph_reason),
        Decision("guided_decoding", m.guided_decoding.backend, _guided_reason(loaded)),
        Decision("fmha.order", ", ".join(fmha_order), fmha_reason),
        Decision("host_dispatch", m.host_dispatch.mode, _dispatch_reason(loaded, chain)),
    ]
    if m.runtime.tensor_parallel_size > 1:
        decisions.append(_tensor_parallel(loaded))

    return Plan(
        name=m.name,
        package=python_package(m.name),
        distribution=f"fastpath-gen-{m.name}",
        manifest_path=manifest_path,
        manifest_sha256=loaded.sha256,
        model=m.model.checkpoint,
        dtype=m.model.dtype,
        seed=m.model.seed,
        device=m.runtime.device,
        max_batch_size=m.runtime.max_batch_size,
        max_seq_len=m.runtime.max_seq_len,
        tensor_parallel_size=m.runtime.tensor_parallel_size,
        cuda_graphs=cuda_graphs,
        graph_batch_sizes=graph_sizes,
        guided_backend=m.guided_decoding.backend,
        hooks=hooks,
        dispatch_mode=m.host_dispatch.mode,
        on_unsupported=m.host_dispatch.on_unsupported,
        dispatch_chain=chain,
        fmha_prepend=m.fmha.prepend,
        fmha_enabled=m.fmha.enabled,
        fmha_order=fmha_order,
        decisions=tuple(decisions),
        serve=_serve(loaded),
    )


def _serve(loaded: LoadedManifest) -> ServePlan:
    s = loaded.manifest.serve
    return ServePlan(
        served_model_name=s.served_model_name or loaded.manifest.name,
        host=s.host,
        port=s.port,
        api_key_env=s.api_key_env,
        max_queued_requests=s.max_queued_requests,
        max_tokens=s.max_tokens,
        max_request_bytes=s.max_request_bytes,
        drain_timeout_s=float(s.drain_timeout_s),
        stream_interval=s.stream_interval,
        api_server_count=s.api_server_count,
        enable_auto_tool_choice=s.enable_auto_tool_choice,
        tool_call_parser=s.tool_call_parser,
        reasoning_parser=s.reasoning_parser,
    )


def _tensor_parallel(loaded: LoadedManifest) -> Decision:
    """tp against the model's head counts, when the model's config is at hand; devices at run time."""
    m = loaded.manifest
    tp = m.runtime.tensor_parallel_size
    key = (
        ("runtime", "tensor_parallel_size")
        if loaded.line_of("runtime", "tensor_parallel_size")
        else ("runtime", "tp")
    )
    splits = _model_splits(m.model.checkpoint)
    problems = tensor_parallel_problems(*splits, tp) if splits is not None else []
    if problems:
        line, column = loaded.document.values.get(key, (1, 1))
        message = f"tensor_parallel_size {tp}: " + "; ".join(problems)
        raise ManifestError.at(loaded.filename, line, column, message, ".".join(key))
    checked = (
        "head counts divide"
        if splits is not None
        else "the model's config is not readable here; checked at load"
    )
    return Decision(
        "tensor_parallel", str(tp), f"declared{_at(loaded, *key)}; {checked}; needs {tp} CUDA devices"
    )


def _check_context_length(loaded: LoadedManifest) -> None:
    """max_seq_len against the model's max_position_embeddings, where the model's config is at hand: the
    engine refuses it at load (vLLM does too), so a deployment learns it here, not on the server."""
    m = loaded.manifest
    positions = _model_positions(m.model.checkpoint)
    if positions is None or m.runtime.max_seq_len <= positions or os.environ.get(ALLOW_LONG_ENV) == "1":
        return
    line, column = loaded.document.values.get(("runtime", "max_seq_len"), (1, 1))
    message = (
        f"max_seq_len {m.runtime.max_seq_len} is longer than the model's max_position_embeddings "
        f"{positions} ({m.model.checkpoint}): positions past it give worse text; set {ALLOW_LONG_ENV}=1 "
        "where it is compiled and where it runs to allow it anyway"
    )
    raise ManifestError.at(loaded.filename, line, column, message, "runtime.max_seq_len")


def _config_json(checkpoint: str) -> dict | None:
    """A checkpoint folder's config.json, or None where it is not readable here (the engine checks when
    it loads the model). Read with json, not the runtime's ModelConfig: the compiler (and --validate)
    never imports torch."""
    try:
        config = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _model_positions(checkpoint: str) -> int | None:
    """max_position_embeddings of a preset, a catalog model or a checkpoint's config.json; None if unknown."""
    if checkpoint.startswith(RANDOM_PREFIX):
        return RANDOM_PRESET_POSITIONS.get(checkpoint.removeprefix(RANDOM_PREFIX))
    if checkpoint in CATALOG_POSITIONS:
        return CATALOG_POSITIONS[checkpoint]
    value = (_config_json(checkpoint) or {}).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _model_splits(checkpoint: str) -> tuple[int, int, int] | None:
    """(heads, KV heads, intermediate size) of a preset or a checkpoint's config.json; None if unreadable."""
    if checkpoint.startswith(RANDOM_PREFIX):
        return RANDOM_PRESET_SPLITS.get(checkpoint.removeprefix(RANDOM_PREFIX))
    if checkpoint in CATALOG_SPLITS:
        return CATALOG_SPLITS[checkpoint]
    config = _config_json(checkpoint)
    try:
        heads = int(config["num_attention_heads"])
        return heads, int(config.get("num_key_value_heads") or heads), int(config["intermediate_size"])
    except (ValueError, KeyError, TypeError):
        return None


def _at(loaded: LoadedManifest, *key: str | int) -> str:
    """' at line N' for a key the manifest writes, else ''."""
    line = loaded.line_of(*key)
    return f" at line {line}" if line else ""


def _hooks(loaded: LoadedManifest) -> HookPlan:
    hooks = loaded.manifest.hooks
    events = hooks.executor_events
    problems: list[Diagnostic] = []

    def ref(path: str, call: hook_calls.HookCall, *key: str | int) -> HookRef:
        module, attr = split_import_path(path)
        problem = hook_lookup.problem(module, attr)
        if problem is None and (wrong := hook_calls.problem(module, attr, call)) is not None:
            problem = f"{module}:{attr} {wrong}"
        if problem is not None:
            line, column = loaded.document.values.get(key, (loaded.line_of(*key) or 1, 1))
            where = ".".join(map(str, key))
            problems.append(Diagnostic(loaded.filename, line, column, f"hook {path!r}: {problem}", where))
        return HookRef(module, attr, loaded.line_of(*key))

    def refs(event: str) -> tuple[HookRef, ...]:
        paths = getattr(events, event)
        return tuple(
            ref(p, hook_calls.EVENT, "hooks", "executor_events", event, i) for i, p in enumerate(paths)
        )

    plan = HookPlan(
        loop_on_execution_stream=hooks.loop_on_execution_stream,
        decode_prologue=ref(hooks.decode_prologue, hook_calls.PROLOGUE, "hooks", "decode_prologue")
        if hooks.decode_prologue
        else None,
        after_warmup=refs("after_warmup"),
        before_overlap_loop=refs("before_overlap_loop"),
        at_shutdown=refs("at_shutdown"),
    )
    if problems:
        raise ManifestError(problems)
    return plan


def _hook_decisions(loaded: LoadedManifest, hooks: HookPlan) -> list[Decision]:
    def off(*key: str) -> Decision:
        subject = ".".join(key)
        if loaded.line_of(*key):
            return Decision(subject, "off", f"declared off{_at(loaded, *key)}")
        return Decision(subject, "off", "not declared: off by default")

    decisions = []
    loop_key = ("hooks", "loop_on_execution_stream")
    if hooks.loop_on_execution_stream:
        note = _stream_note(loaded.manifest.runtime.device)
        decisions.append(Decision(".".join(loop_key), "on", f"declared{_at(loaded, *loop_key)}{note}"))
    elif loaded.manifest.guided_decoding.backend != "none":
        # The schema refuses asking for both; record why the gate must stay shut.
        reason = f"off: {LOOP_VS_GUIDED}"
        decisions.append(Decision(".".join(loop_key), "off", reason))
    else:
        decisions.append(off(*loop_key))

    if hooks.decode_prologue:
        where = _at(loaded, "hooks", "decode_prologue")
        decisions.append(
            Decision("hooks.decode_prologue", "on", f"{hooks.decode_prologue.path}, declared{where}")
        )
    else:
        decisions.append(off("hooks", "decode_prologue"))

    for event, refs in hooks.executor_events().items():
        key = ("hooks", "executor_events", event)
        if refs:
            paths = ", ".join(r.path for r in refs)
            decisions.append(Decision(".".join(key), "on", f"{paths}, declared{_at(loaded, *key)}"))
        else:
            decisions.append(off(*key))
    return decisions


def _guided_reason(loaded: LoadedManifest) -> str:
    if loaded.manifest.guided_decoding.backend == "none":
        return "off unless declared"
    return f"declared{_at(loaded, 'guided_decoding', 'backend')}; its grammar work runs on a side stream"


def _stream_note(device: str) -> str:
    if device == "cpu":
        return "; a no-op at run time on cpu, which has no CUDA streams"
    if device == "auto":
        return "; a no-op when CUDA is absent at run time"
    return ""


def _on_off_auto(value: bool | None) -> str:
    return "auto" if value is None else "on" if value else "off"


def _cuda_graphs(loaded: LoadedManifest) -> tuple[bool | None, tuple[int, ...] | None, str]:
    runtime = loaded.manifest.runtime
    enabled, device = runtime.cuda_graphs.enabled, runtime.device
    key = ("runtime", "cuda_graphs", "enabled")
    if enabled is False:
        return False, None, f"declared off{_at(loaded, *key)}"
    if enabled == "auto" and device == "cpu":
        return False, None, "auto: off, because device is cpu"
    if runtime.cuda_graphs.batch_sizes is not None:
        sizes = runtime.cuda_graphs.batch_sizes
        sizes_reason = f"batch sizes declared{_at(loaded, 'runtime', 'cuda_graphs', 'batch_sizes')}"
    else:
        sizes = default_graph_batch_sizes(runtime.max_batch_size)
        sizes_reason = "batch sizes by default: powers of two up to max_batch_size"
    if enabled is True:
        return True, sizes, f"declared on{_at(loaded, *key)}; {sizes_reason}"
    if device == "cuda":
        return True, sizes, f"auto: on, because device is cuda; {sizes_reason}"
    return None, sizes, f"auto: on when CUDA is present at run time; {sizes_reason}"


def _fmha_order(loaded: LoadedManifest) -> tuple[tuple[str, ...], str]:
    fmha = loaded.manifest.fmha
    rest = fmha.enabled if fmha.enabled is not None else DEFAULT_FMHA_ORDER
    order = (*fmha.prepend, *(name for name in rest if name not in fmha.prepend))
    parts = [f"prepend (declared{_at(loaded, 'fmha', 'prepend')})"] if fmha.prepend else []
    if fmha.enabled is not None:
        parts.append(f"enabled (declared{_at(loaded, 'fmha', 'enabled')})")
    else:
        parts.append("the runtime's default order")
    return order, ", then ".join(parts)


def _dispatch_reason(loaded: LoadedManifest, chain: tuple[str, ...]) -> str:
    dispatch = loaded.manifest.host_dispatch
    mode_key = ("host_dispatch", "mode")
    where = f"declared{_at(loaded, *mode_key)}" if loaded.line_of(*mode_key) else "by default"
    tried = " -> ".join(chain)
    if dispatch.mode == "spin":
        fallback = "one warning per process" if dispatch.on_unsupported == "warn_once" else "an error"
        how = f"try {tried}; falling back to blocking gives {fallback} (on_unsupported: {dispatch.on_unsupported})"
    elif dispatch.mode == "auto":
        how = f"the first of {tried} that works here, silently"
    else:
        how = "cudaLaunchHostFunc"
    if dispatch.mode != "spin" and loaded.line_of("host_dispatch", "on_unsupported"):
        how += f"; on_unsupported does not apply to {dispatch.mode}"
    return f"{where}: {how}; callbacks run inline, in order, when CUDA is absent at run time"
