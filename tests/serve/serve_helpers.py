"""Starting servers on loopback for tests: in-process (a uvicorn thread) or as a subprocess."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai

from fastpath.runtime import LLM
from fastpath.runtime.serve import ServeConfig, make_server

START_S = 60.0  # bound on a server's start-up
STOP_S = 30.0


@contextlib.contextmanager
def engine(checkpoint: Path, **kwargs) -> Iterator[LLM]:
    # The engine runs in a process of its own, as `fastpath serve` runs it.
    options = dict(
        device="cpu", max_seq_len=512, max_batch_size=16, guided_backend="auto", engine_process=True
    )
    with LLM(str(checkpoint), **{**options, **kwargs}) as llm:
        yield llm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(llm: LLM, **config) -> Iterator[str]:
    """An in-process server for `llm` on a free loopback port; its base URL (no /v1)."""
    sock = socket.socket(
        socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # so asyncio sets TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make_server(llm, ServeConfig(port=port, **config), model_name="tiny", log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_S
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_S)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def client(url: str, api_key: str = "none", cls=openai.OpenAI):
    return cls(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)


def metric(url: str, name: str) -> float:
    """One sample of /metrics, by its full name."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics:\n{text}")


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)


@contextlib.contextmanager
def subprocess_server(argv: list[str], port: int, log: Path, env: dict | None = None):
    """A server process (`python -m ...`) on `port`, ready once /health answers; yields the Popen.
    Its output goes to `log` (a pipe nobody reads could fill and stall it)."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, f"the server exited early:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the server did not start:\n{log.read_text()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(STOP_S)


def cut_anywhere(data, text: str) -> list[str]:
    """`text` cut at up to six places hypothesis draws from `data` (st.data()): a stream's pieces."""
    from hypothesis import strategies as st

    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
