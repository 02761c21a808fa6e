"""A server whose engine dies exits with status 1 (after draining), so whatever supervises it restarts
it: vLLM's API server does the same when its engine core dies. Run as a deployment runs it."""

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import httpx
from serve_helpers import free_port, subprocess_server
from test_serve_api_servers import alive, children

BOUND_S = 60.0


def engine_pids(server: int) -> list[int]:
    """The server's children but multiprocessing's resource tracker: the engine process."""
    found = []
    for pid in children(server):
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def test_a_server_whose_engine_process_is_killed_exits_with_status_1(tiny_text_checkpoint, tmp_path):
    port, log = free_port(), tmp_path / "server.log"
    argv = ["-m", "fastpath.serve", str(tiny_text_checkpoint), "--port", str(port), "--device", "cpu",
            "--max-seq-len", "256", "--max-batch-size", "4", "--guided-backend", "none",
            "--drain-timeout", "5"]  # fmt: skip
    with subprocess_server(argv, port, log) as proc:
        (engine,) = engine_pids(proc.pid)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        os.kill(engine, signal.SIGKILL)
        try:
            code = proc.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server outlived its engine:\n{log.read_text()}") from None
        assert code == 1, log.read_text()
        assert not alive(engine)
    text = log.read_text()
    assert "the engine closed" in text and "exiting with status 1" in text, text
    assert "the engine closed: draining" in text and "SIGTERM" not in text, "no signal was sent"
    assert "nanobind" not in text, "the frozen heap is thawed before exit"
