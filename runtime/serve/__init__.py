"""fastpath.runtime.serve: an OpenAI-compatible HTTP server over an LLM, on the runtime's public API.

`build_app(llm, ServeConfig(...))` is the FastAPI app; `serve(llm, config)` runs it under uvicorn and
drains on SIGTERM; `cli.run(llm_factory, args)` is what `fastpath serve` and every generated package's
`python -m <pkg> serve` call. Needs the `serve` extra (FastAPI, uvicorn, prometheus-client).
"""

from .app import build_app
from .config import ServeConfig
from .server import make_server, serve

__all__ = ["ServeConfig", "build_app", "make_server", "serve"]
