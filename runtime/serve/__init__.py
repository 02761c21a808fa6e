"""fastpath.runtime.serve: an OpenAI-compatible HTTP server over an LLM, on the runtime's public API.

`build_app(llm, ServeConfig(...))` is the FastAPI app; `serve(llm, config)` runs it under uvicorn and
drains on SIGTERM; `cli.run(llm_factory, args)` is what `fastpath serve` and every generated package's
`python -m <pkg> serve` call. Needs the `serve` extra (FastAPI, uvicorn, prometheus-client).
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use, so the command line can say what is missing instead of a traceback.
_EXPORTS = {"ServeConfig": ".config", "build_app": ".app", "make_server": ".server", "serve": ".server"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
