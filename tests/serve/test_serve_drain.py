"""SIGTERM: the server stops admitting, lets running requests finish within the drain bound, cuts the
rest, and exits 0 (a subprocess, as a deployment runs it)."""

import json
import signal
import threading
import time

import httpx
from serve_helpers import free_port, subprocess_server

DRAIN_S = 2.0


def _stream(url: str, max_tokens: int, seen: threading.Event, result: dict) -> None:
    body = {"prompt": "The quick brown fox", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    events = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    seen.set()
    except httpx.HTTPError as exc:  # the cut one: its connection closes mid-stream
        result["error"] = type(exc).__name__
    result["events"] = events
    seen.set()


def test_sigterm_drains_running_requests_and_exits_0(tiny_text_checkpoint, tmp_path):
    port = free_port()
    argv = ["-m", "fastpath.serve", str(tiny_text_checkpoint), "--port", str(port), "--device", "cpu"]
    argv += ["--max-seq-len", "2048", "--drain-timeout", str(DRAIN_S), "--guided-backend", "none"]
    url = f"http://127.0.0.1:{port}"
    with subprocess_server(argv, port, tmp_path / "server.log") as proc:
        # short: finishes well inside the bound; long: 2000 tokens at ~10 ms a step cannot.
        runs = {"short": (80, threading.Event(), {}), "long": (2000, threading.Event(), {})}
        threads = [
            threading.Thread(target=_stream, args=(url, n, seen, result), daemon=True)
            for n, seen, result in runs.values()
        ]
        for t in threads:
            t.start()
        for _, seen, _ in runs.values():
            assert seen.wait(30), "a stream never started"
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        try:  # no longer admitting: the listener is closed (or, on a live connection, 503)
            refused = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"}, timeout=5).status_code == 503
        except httpx.HTTPError:
            refused = True
        assert refused
        assert proc.wait(DRAIN_S + 20) == 0, (tmp_path / "server.log").read_text()
        took = time.monotonic() - signalled
        for t in threads:
            t.join(10)
    assert took < DRAIN_S + 15
    short, long = runs["short"][2], runs["long"][2]
    assert short["events"][-1] == "[DONE]", "a request within the bound finishes whole"
    finals = [json.loads(e)["choices"][0]["finish_reason"] for e in short["events"][:-1]]
    assert finals[-1] == "length"
    cut = [json.loads(e) for e in long["events"] if e != "[DONE]"]
    assert cut and all(e.get("choices", [{}])[0].get("finish_reason") is None for e in cut), (
        "a request past the bound is cut"
    )
    if long["events"][-1] == "[DONE]":  # the loop got to end the cut stream: it says why, then [DONE]
        assert cut[-1]["error"]["code"] == 503
    log = (tmp_path / "server.log").read_text()
    assert "draining" in log
    assert '"event": "http_request"' in log, "access log lines are JSON"
    assert "Traceback" not in log
