"""fastpath.runtime: the native baseline engine.

Heavy modules (torch) load on first use, so `import fastpath.runtime` stays cheap for the compiler.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": ".llm",
    "SamplingParams": ".sampling_params",
    "RequestOutput": ".outputs",
    "RequestError": ".outputs",
    "StreamToken": ".outputs",
    "ModelConfig": ".config",
    "RuntimeHooks": ".hooks",
    "EventLists": ".hooks",
    "runtime_hooks_of": ".hooks",
    "ExecutorCore": ".executor_core",
    "NativeExecutor": ".native_executor",
    "WorkerLost": ".parallel.state",
    "HostDispatcher": ".hostfunc",
    "launch_hostfunc": ".hostfunc",
    "set_dispatch": ".hostfunc",
    "dispatch_info": ".hostfunc",
    "check": ".hostfunc",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fastpath.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
