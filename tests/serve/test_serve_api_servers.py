"""`fastpath serve --api-server-count N`: several API server processes in front of one engine process,
as a deployment runs it (a subprocess). Every server's requests join one batch and get their solo
tokens, /metrics sums every server's requests, a disconnect through any of them frees its blocks,
SIGTERM drains them all and exits 0, and a server that dies takes the whole down with status 1."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import client, free_port, metric, subprocess_server, wait_until

BOUND_S = 60.0
DRAIN_S = 10.0  # a request running at SIGTERM finishes well inside it, on a loaded machine too


def children(pid: int) -> list[int]:
    """Live child processes of `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running, or stopped: neither gone nor a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def serving_pids(log: Path) -> dict[int, int]:
    """API server index -> pid, from each server's "API server k/N (pid P): serving" line."""
    found = re.findall(r"API server (\d+)/\d+ \(pid (\d+)\): serving", log.read_text())
    return {int(k): int(pid) for k, pid in found}


def logged_pids(log: Path) -> set[int]:
    return {int(pid) for pid in re.findall(r'"pid": (\d+)', log.read_text())}


def argv(checkpoint: Path, port: int, count: int = 2) -> list[str]:
    return [
        "-m", "fastpath.serve", str(checkpoint), "--port", str(port), "--device", "cpu",
        "--api-server-count", str(count), "--max-seq-len", "512", "--max-batch-size", "16",
        "--guided-backend", "none", "--drain-timeout", str(DRAIN_S), "--served-model-name", "tiny",
    ]  # fmt: skip


@contextlib.contextmanager
def api_servers(checkpoint: Path, log: Path):
    port = free_port()
    with subprocess_server(argv(checkpoint, port), port, log) as proc:
        kids = children(proc.pid)
        try:
            yield proc, f"http://127.0.0.1:{port}", log
        finally:
            for pid in kids:  # whatever a failed test left running
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def shared(tiny_text_checkpoint, tmp_path_factory):
    """One server for the tests that leave it running."""
    with api_servers(tiny_text_checkpoint, tmp_path_factory.mktemp("shared") / "server.log") as running:
        yield running


@pytest.fixture
def two_servers(tiny_text_checkpoint, tmp_path):
    """A server of its own, for a test that ends it."""
    with api_servers(tiny_text_checkpoint, tmp_path / "server.log") as running:
        yield running


def test_every_api_server_joins_one_batch_and_each_request_gets_its_solo_tokens(shared):
    proc, url, log = shared
    wait_until(lambda: len(serving_pids(log)) == 2, BOUND_S, "both API servers to serve")
    assert set(serving_pids(log).values()) < set(children(proc.pid)), "an engine process and two API servers"
    prompts = [f"The number {i} is" for i in range(8)]
    api = client(url)
    solo = {
        p: api.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0.0).choices[0].text
        for p in prompts
    }
    got: dict[int, str] = {}

    def stream(i: int) -> None:
        chunks = client(url).completions.create(
            model="tiny", prompt=prompts[i % 8], max_tokens=12, temperature=0.0, stream=True
        )
        got[i] = "".join(c.choices[0].text for c in chunks)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
    assert [got.get(i) for i in range(32)] == [solo[prompts[i % 8]] for i in range(32)]
    # whichever server answers the scrape, it counts every server's requests
    route = 'fastpath_http_requests_total{route="/v1/completions",status="200"}'
    wait_until(lambda: metric(url, route) == 40, 10, "the last response to be counted")
    assert {metric(url, route) for _ in range(4)} == {40.0}
    # Connections go to whichever server accepts first; fresh ones soon reach both.
    # A short pause between them lets either server's accept win, even when one is busier.
    for _ in range(400):
        httpx.get(f"{url}/health", timeout=10)
        if len(logged_pids(log)) == 2:
            break
        time.sleep(0.01)
    assert logged_pids(log) == set(serving_pids(log).values()), "each server answers and logs its pid"


def test_a_disconnect_through_any_api_server_frees_its_blocks(shared):
    _, url, _ = shared
    total = metric(url, "fastpath_kv_cache_blocks_total")
    body = {"prompt": "The quick brown fox", "max_tokens": 400, "ignore_eos": True, "stream": True}
    for _ in range(3):  # connections land on either server
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=BOUND_S) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
        wait_until(
            lambda: metric(url, "fastpath_kv_cache_blocks_free") == total, BOUND_S, "the blocks to be freed"
        )
    assert metric(url, "fastpath_requests_running") == 0


def test_sigterm_drains_every_api_server_and_exits_0(two_servers):
    proc, url, log = two_servers
    kids = children(proc.pid)
    started, finals = threading.Event(), []

    def stream() -> None:  # streamed, so the signal is sent while it is known to run
        chunks = client(url).completions.create(
            model="tiny", prompt="Hi", max_tokens=30, stream=True, extra_body={"ignore_eos": True}
        )
        for chunk in chunks:
            started.set()
            finals.append(chunk.choices[0].finish_reason)

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(BOUND_S), "the stream never started"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DRAIN_S + 30) == 0, log.read_text()
    t.join(BOUND_S)
    assert finals and finals[-1] == "length", "a running request finishes within the drain"
    wait_until(lambda: not any(alive(p) for p in kids), 10, "every child to exit")
    assert "Traceback" not in log.read_text()


def test_an_api_server_that_dies_stops_the_whole_with_status_1(two_servers):
    proc, _url, log = two_servers
    wait_until(lambda: len(serving_pids(log)) == 2, BOUND_S, "both API servers to serve")
    kids = children(proc.pid)
    os.kill(serving_pids(log)[1], signal.SIGKILL)
    assert proc.wait(DRAIN_S + 30) == 1, log.read_text()
    assert "exited with code -9" in log.read_text()
    wait_until(lambda: not any(alive(p) for p in kids), 10, "every child to exit")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--api-server-count", "0"], "api_server_count must be an int in [1, 64]"),
        (["--api-server-count", "2", "--no-engine-process"], "needs the engine process"),
    ],
)
def test_a_bad_api_server_count_is_refused_before_anything_starts(extra, message):
    cmd = [sys.executable, "-m", "fastpath.serve", "random:tiny-llama", "--device", "cpu", *extra]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND_S)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_killed_supervisor_leaves_no_process_behind(two_servers):
    proc, _url, log = two_servers
    wait_until(lambda: len(serving_pids(log)) == 2, BOUND_S, "both API servers to serve")
    kids = children(proc.pid)
    proc.kill()
    proc.wait(10)
    wait_until(lambda: not any(alive(p) for p in kids), DRAIN_S + 30, "every orphan to exit")
    assert "is gone; draining" in log.read_text()


def test_each_api_server_admits_its_share_and_any_valid_request_when_idle():
    from fastpath.runtime.serve.config import AdmissionGate
    from fastpath.runtime.serve.errors import RequestInvalid, Unavailable

    gate = AdmissionGate(batch_slots=8, max_queued=8, share=4)  # a bound of 16, 4 a server
    gate.enter(12)  # idle: a request valid for the whole server is taken
    with pytest.raises(Unavailable):
        gate.enter(1)
    gate.leave(12)
    gate.enter(3)
    gate.enter(1)
    with pytest.raises(Unavailable):
        gate.enter(1)
    with pytest.raises(RequestInvalid, match="bound of 16"):
        AdmissionGate(8, 8, share=4).enter(17)
