"""fastpath.runtime: the native baseline engine, grouped by concept (docs/architecture.md):
engine/ (LLM, executor, scheduler), runner/ (one step on the device), model/, attention/,
kernels/, guided/, parallel/ (tensor-parallel processes), dispatch/ (host dispatch), and the hook
surface a manifest names (hooks, prologues, events).

Heavy modules (torch) load on first use, so `import fastpath.runtime` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": ".engine.llm",
    "SamplingParams": ".engine.sampling_params",
    "GuidedDecodingParams": ".engine.sampling_params",
    "StructuredOutputsParams": ".engine.sampling_params",  # vLLM's newer name for GuidedDecodingParams
    "TextPrompt": ".engine.prompts",  # vLLM's prompt dicts, typed
    "TokensPrompt": ".engine.prompts",
    "LoRARequest": ".engine.lora_request",  # vLLM's: which adapter a request runs with (enable_lora)
    "PoolingParams": ".engine.pooling",  # vLLM's embed() and encode()
    "EmbeddingRequestOutput": ".engine.outputs",
    "EmbeddingOutput": ".engine.outputs",
    "PoolingRequestOutput": ".engine.outputs",
    "PoolingOutput": ".engine.outputs",
    "ScoringRequestOutput": ".engine.outputs",
    "ScoringOutput": ".engine.outputs",
    "BeamSearchParams": ".engine.beam_search",  # vLLM's LLM.beam_search and what it returns
    "BeamSearchOutput": ".engine.beam_search",
    "BeamSearchSequence": ".engine.beam_search",
    "RequestOutput": ".engine.outputs",
    "CompletionOutput": ".engine.outputs",
    "Logprob": ".engine.outputs",
    "RequestError": ".engine.outputs",
    "EngineClosedError": ".engine.outputs",
    "StreamToken": ".engine.outputs",
    "RequestHandle": ".engine.request",
    "EngineStats": ".engine.core",
    "ExecutorCore": ".engine.executor",
    "NativeExecutor": ".engine.native_executor",
    "ModelRunner": ".runner.runner",
    "ModelConfig": ".model.config",
    "RuntimeHooks": ".hooks",
    "EventLists": ".hooks",
    "HookError": ".hooks",
    "runtime_hooks_of": ".hooks",
    "WorkerLost": ".parallel.state",
    "HostDispatcher": ".dispatch.dispatcher",
    "launch_hostfunc": ".dispatch.dispatcher",
    "set_dispatch": ".dispatch.dispatcher",
    "dispatch_info": ".dispatch.dispatcher",
    "check": ".dispatch.dispatcher",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fastpath.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
