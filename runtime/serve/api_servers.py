"""Several API server processes in front of one engine process: `fastpath serve --api-server-count N`.

One API process turns about 30k streamed tokens a second into HTTP (docs/performance.md), fewer than
a 1B model's engine makes at batch 64 on an H200. With N of them, the process that runs this serves
no HTTP itself: it owns the engine process, binds the listening socket, opens one engine link per
API server and spawns them, and the kernel hands each connection to whichever of them accepts it
first. Each API server is the ordinary server (server.py) over `LLM.attach`.

SIGTERM or SIGINT is passed on; every API server drains within its own bound, then the engine
closes. An API server or an engine process that dies takes the rest down with exit status 1, so the
deployment's supervisor restarts the whole rather than running on with part of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .config import ServeConfig
from .metrics import MULTIPROC_ENV

log = logging.getLogger("fastpath.serve")

WATCH_POLL_S = 0.5
STOP_MARGIN_S = 15.0  # beyond the drain bound: an API server's own shutdown and its engine link's
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class ApiServerSpec:
    """What one API server process is started with."""

    index: int  # 1..count
    count: int
    supervisor: int  # its pid: once it is not this process's parent, the server drains
    recipe: Any  # the engine's LLM.recipe: how to build an LLM that attaches to it
    info: dict[str, Any]  # the engine's description (its client's info)
    conn: Any  # this server's link into the engine
    sock: socket.socket  # the listening socket every API server shares
    config: ServeConfig
    model_name: str | None
    log_level: str


def api_server_main(spec: ApiServerSpec) -> None:
    """An API server process: the ordinary server over an LLM attached to the shared engine."""
    from .cli import configure_logging
    from .server import serve

    configure_logging(spec.log_level)
    llm = spec.recipe.llm_cls.attach(spec.recipe, spec.conn, spec.info, spec.index)
    watch = threading.Thread(
        target=_drain_when_alone, args=(spec.supervisor, llm), name="fastpath-watch", daemon=True
    )
    watch.start()
    try:
        serve(
            llm,
            spec.config,
            model_name=spec.model_name,
            sock=spec.sock,
            log_level=spec.log_level,
            label=f"API server {spec.index}/{spec.count} (pid {os.getpid()}): ",
            watch_engine=False,  # _drain_when_alone watches the engine and the supervisor
        )
    finally:
        llm.close()


def _drain_when_alone(supervisor: int, llm: Any) -> None:
    """A supervisor that died without a word (SIGKILL), or an engine that closed, leaves this server
    with nothing to serve: it drains and exits as on SIGTERM, rather than holding the port."""
    while os.getppid() == supervisor and llm.closed_reason is None:
        time.sleep(WATCH_POLL_S)
    if os.getppid() != supervisor:
        log.warning("the supervising process (pid %d) is gone; draining", supervisor)
    else:
        log.warning("the engine closed (%s); draining", llm.closed_reason)
    os.kill(os.getpid(), signal.SIGTERM)


def serve_many(
    llm: Any, config: ServeConfig, *, model_name: str | None = None, log_level: str = "info"
) -> int:
    """Serve `llm` (an LLM whose engine runs in its own process) through `config.api_server_count`
    API server processes until SIGTERM or SIGINT; 0 once all drained, 1 if a part died. The caller
    closes `llm`."""
    if getattr(llm, "recipe", None) is None or not llm.in_engine_process:
        raise ValueError(
            "api_server_count above 1 needs the engine in a process of its own (engine_process=True, "
            "the server's default)"
        )
    sock = listen(config.host, config.port)
    config = dataclasses.replace(config, port=sock.getsockname()[1])
    procs: list[Any] = []
    with _signals_to_event() as stop, _metrics_dir():
        try:
            with sock:  # each server holds a copy; once they close theirs (a drain), connections are refused
                for index in range(1, config.api_server_count + 1):
                    if stop.is_set():
                        break
                    procs.append(_start_server(llm, config, index, sock, model_name, log_level))
        except BaseException:
            _stop_all(procs, STOP_MARGIN_S)  # a failed start leaves no server behind
            raise
        log.info(
            "serving on %s://%s:%d%s through %d API server processes (pids %s), engine process pid %s",
            config.scheme,
            config.host,
            config.port,
            config.root_path,
            len(procs),
            ", ".join(str(p.pid) for p in procs),
            llm.engine_pid,
        )
        return _supervise(procs, llm, config.drain_timeout_s, stop)


def _start_server(
    llm: Any, config: ServeConfig, index: int, sock: socket.socket, model_name: str | None, log_level: str
) -> Any:
    conn, info = llm.open_link()
    spec = ApiServerSpec(
        index,
        config.api_server_count,
        os.getpid(),
        llm.recipe,
        info,
        conn,
        sock,
        config,
        model_name,
        log_level,
    )
    proc = mp.get_context("spawn").Process(
        target=api_server_main, args=(spec,), name=f"fastpath-api-server-{index}"
    )
    try:
        proc.start()
    finally:
        conn.close()  # the API server holds the link now; its exit closes it
    return proc


def listen(host: str, port: int) -> socket.socket:
    """The socket every API server accepts on, bound here so that port 0 gives all of them one port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelt out: asyncio sets TCP_NODELAY only on sockets that say so, and without it
    # Nagle's algorithm holds a stream's small events back for delayed ACKs (40 ms stalls).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def _signals_to_event() -> Iterator[threading.Event]:
    """SIGTERM and SIGINT set the event, from before the first server starts until the last stops."""
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in _SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _metrics_dir() -> Iterator[None]:
    """Where every API server's request metrics go, so each /metrics shows their sum. A fresh one
    lives as long as the servers; one the deployment set is used as it is (it is not emptied, so
    files left there by earlier servers add to the sums)."""
    if os.environ.get(MULTIPROC_ENV):
        log.warning(
            "%s is set (%s): its files are summed into /metrics as they are; empty it between runs",
            MULTIPROC_ENV,
            os.environ[MULTIPROC_ENV],
        )
        yield
        return
    path = tempfile.mkdtemp(prefix="fastpath-metrics-")
    os.environ[MULTIPROC_ENV] = path  # the spawned servers take it with them
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def _supervise(procs: list[Any], llm: Any, drain_s: float, stop: threading.Event) -> int:
    failure = None
    while not stop.wait(0.1):
        dead = next((p for p in procs if p.exitcode is not None), None)
        if dead is not None:
            failure = f"API server {dead.name} (pid {dead.pid}) exited with code {dead.exitcode}"
            break
        if llm.closed_reason is not None:
            failure = f"the engine closed: {llm.closed_reason}"
            break
    if failure is not None:
        log.error("%s; stopping the other API servers", failure)
    else:
        log.info("stopping: %d API server(s) drain for up to %.1f s", len(procs), drain_s)
    _stop_all(procs, drain_s + STOP_MARGIN_S)
    cut = [p for p in procs if p.exitcode not in (0, -signal.SIGTERM)]
    for p in cut:
        if failure is None:
            log.warning("API server %s (pid %s) ended with code %s", p.name, p.pid, p.exitcode)
    return 1 if failure is not None or cut else 0


def _stop_all(procs: list[Any], bound_s: float) -> None:
    """SIGTERM each (it drains), wait up to `bound_s` for all, then kill the rest."""
    for p in procs:
        if p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + bound_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            log.warning(
                "API server %s (pid %s) did not stop within %.0f s; killing it", p.name, p.pid, bound_s
            )
            p.kill()
            p.join(5)
