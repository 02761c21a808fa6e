"""Run an app under uvicorn; SIGTERM (or Ctrl-C) drains it and returns, so the process exits 0.

On the signal uvicorn stops listening (new connections are refused, which is how a load balancer
sees the drain), and on connections still open the gate answers new requests, /health included,
with 503. Running responses finish for up to `drain_timeout_s`; then the rest are cut (a stream
ends with a 503 error event and [DONE]) and the engine aborts their requests. Unlike plain uvicorn, the signal is not raised again afterwards.

An engine that closes on its own (its process killed, a step that failed) leaves nothing to serve: the
server drains the same way and `serve` returns False, so the command exits 1 and whatever supervises
it (systemd, Kubernetes) restarts it, where a server answering 503 for ever would only be routed around.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from ..engine.gil import prompt_handoffs
from ..engine.heap import freeze_startup_heap
from .app import build_app
from .config import ServeConfig
from .state import ServerState

log = logging.getLogger("fastpath.serve")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ENGINE_POLL_S = 0.25


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: Any, why: str | None = None) -> None:
        """`why`: what asked for the drain when no signal did (the engine closing)."""
        if not self.state.gate.draining:
            log.info(
                "%s: draining %d completion(s) for up to %.1f s",
                why or f"signal {signal.Signals(sig).name}",
                self.state.gate.in_flight,
                self.state.config.drain_timeout_s,
            )
        self.state.gate.draining = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def make_server(
    llm: Any, config: ServeConfig, *, model_name: str | None = None, log_level: str = "info"
) -> DrainingServer:
    app = build_app(llm, config, model_name=model_name)
    uv = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        access_log=False,  # ours is structured (middleware.py)
        timeout_graceful_shutdown=config.drain_timeout_s,
        lifespan="off",
        ssl_keyfile=config.ssl_keyfile,
        ssl_certfile=config.ssl_certfile,
        ssl_ca_certs=config.ssl_ca_certs,
        ssl_cert_reqs=config.ssl_cert_reqs,
    )
    return DrainingServer(uv, app.state.fastpath)


def serve(
    llm: Any,
    config: ServeConfig,
    *,
    model_name: str | None = None,
    sock: socket.socket | None = None,
    log_level: str = "info",
    label: str = "",
    watch_engine: bool = True,
) -> bool:
    """Serve until SIGTERM or SIGINT, drain, return True; False when the engine closed first. The
    caller closes `llm`. `label` names this process among several API servers, whose own watch
    (api_servers.py) also follows their supervisor: they pass `watch_engine=False`."""
    if sock is None and config.port == 0:  # bound here, so the log below names the port it got
        from .api_servers import listen

        with listen(config.host, 0) as owned:
            return serve(llm, config, model_name=model_name, sock=owned, log_level=log_level, label=label,
                         watch_engine=watch_engine)  # fmt: skip
    port = sock.getsockname()[1] if sock is not None else config.port
    server = make_server(llm, config, model_name=model_name, log_level=log_level)
    prompt_handoffs()  # the event loop and the engine client's pipe threads pass every token along
    freeze_startup_heap(label)  # the app, the tokenizer and their imports (engine/heap.py)
    engine_closed = threading.Event()
    log.info(
        "%sserving %r on %s://%s:%d%s (OpenAI API under /v1; executor %s%s)",
        label,
        server.state.model_name,
        config.scheme,
        config.host,
        port,
        config.root_path,
        llm.executor_name,
        " in its own process" if llm.in_engine_process else "",
    )
    if watch_engine:
        threading.Thread(
            target=_drain_when_the_engine_closes, args=(server, llm, engine_closed), name="fastpath-engine-watch",
            daemon=True,
        ).start()  # fmt: skip
    server.run(sockets=[sock] if sock is not None else None)
    return not engine_closed.is_set()


def _drain_when_the_engine_closes(server: DrainingServer, llm: Any, engine_closed: threading.Event) -> None:
    while not server.should_exit:
        reason = llm.closed_reason
        if reason is not None:
            log.error("the engine closed (%s): draining, then exiting with status 1", reason)
            engine_closed.set()
            server.handle_exit(signal.SIGTERM, None, why="the engine closed")
            return
        time.sleep(ENGINE_POLL_S)
