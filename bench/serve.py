#!/usr/bin/env python3
"""The HTTP server beside offline generation, on one fixed set of requests, at several concurrencies.

    python bench/serve.py [--out DIR] [--model M] [--tokenizer DIR] [--concurrency 1 16 64] [--quick]

One run, two phases, the same engine options and the same requests (token-id prompts of a fixed
length, `ignore_eos` and a fixed `max_tokens`, so every request makes the same work):

- offline: an in-process LLM; at concurrency c, c threads each submit one request at a time through
  the engine API (`LLM.submit`, no HTTP), so c requests are always in flight; plus one `generate`
  of all the requests at once, the engine's own ceiling.
- server: `python -m fastpath.serve` in a subprocess, driven over loopback by asyncio clients that
  keep c streaming requests in flight (vLLM's benchmark_serving with --max-concurrency c), spread
  over `--client-processes` processes so the clients' own Python is not what is measured.

Reported per row, as vLLM's benchmark reports them: output throughput, time to first token and
inter-token latency (p50, p99; a chunk of k tokens counts as k gaps of its interval / k); for the
server also its own view from /metrics: mean time to first token, and mean queue time (arrival to
the engine's first batch slot), which tell the server's wait from the clients'. The
issue's target: at concurrency 64 the server's throughput is at least 95% of offline `generate`'s.
`--quick` runs a tiny random model on the CPU in about a minute (a smoke test of the bench itself).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, write_outputs


@dataclass(slots=True)
class Timing:
    """One request: when it was sent, when each chunk of tokens arrived, and how many each held."""

    sent: float
    chunks: list[tuple[float, int]] = field(default_factory=list)
    done: float = 0.0  # the stream's end ([DONE] read)
    part: int = 0  # the client process that sent it

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.chunks)

    def ttft(self) -> float:
        return self.chunks[0][0] - self.sent

    def gaps(self) -> list[float]:
        out, last = [], self.chunks[0][0]
        for t, n in self.chunks[1:]:
            out += [(t - last) / n] * n
            last = t
        return out


def summarize(label: str, concurrency: int | str, timings: list[Timing], seconds: float) -> dict:
    tokens = sum(t.tokens for t in timings)
    ttft = sorted(t.ttft() for t in timings if t.chunks)
    itl = sorted(g for t in timings if t.chunks for g in t.gaps())
    busy = sum(t.chunks[-1][0] - t.sent for t in timings if t.chunks)
    # A client slot between its request's last tokens and its next request's sending: the [DONE],
    # the client's own turnaround, and the ramp and tail of the run, spread over the requests.
    idle = (
        (concurrency * seconds - busy) / len(timings)
        if isinstance(concurrency, int) and timings
        else float("nan")
    )
    return {
        "mode": label,
        "concurrency": concurrency,
        "requests": len(timings),
        "output_tokens": tokens,
        "seconds": seconds,
        "output_tok_s": tokens / seconds,
        "ttft_p50_ms": _pct(ttft, 50) * 1e3,
        "ttft_p99_ms": _pct(ttft, 99) * 1e3,
        "itl_p50_ms": _pct(itl, 50) * 1e3,
        "itl_p99_ms": _pct(itl, 99) * 1e3,
        "request_mean_ms": busy / max(len(ttft), 1) * 1e3,
        "slot_idle_mean_ms": idle * 1e3,
    }


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, round(p) - 1))]


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


# --- offline: the engine API, no HTTP ---------------------------------------------------------------


def offline(llm, prompts: list[list[int]], output_len: int, concurrency: int) -> tuple[list[Timing], float]:
    """c threads, each submitting its next request when the last one finished."""
    from fastpath.runtime import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    queue = list(enumerate(prompts))
    timings: list[Timing | None] = [None] * len(prompts)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                i, prompt = queue.pop(0)
            t = Timing(time.perf_counter())
            for out in llm.submit(prompt, params):
                n = len(out.outputs[0].token_ids)
                if n:
                    t.chunks.append((time.perf_counter(), n))
            timings[i] = t

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [t for t in timings if t is not None], time.perf_counter() - start


def offline_generate(llm, prompts: list[list[int]], output_len: int) -> dict:
    """Every request in one `generate` call: no per-token timing, throughput only."""
    from fastpath.runtime import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    nan = float("nan")
    return {"mode": "offline generate (all at once)", "concurrency": "all", "requests": len(prompts),
            "output_tokens": tokens, "seconds": seconds, "output_tok_s": tokens / seconds,
            "ttft_p50_ms": nan, "ttft_p99_ms": nan, "itl_p50_ms": nan, "itl_p99_ms": nan}  # fmt: skip


# --- the server: a subprocess, a streaming client on loopback ------------------------------------


async def one_request(http: httpx.AsyncClient, prompt: list[int], output_len: int) -> Timing:
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}  # fmt: skip
    t = Timing(time.perf_counter())
    async with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            n = sum(len(c.get("token_ids", ())) for c in event["choices"])
            if n:
                t.chunks.append((time.perf_counter(), n))
    t.done = time.perf_counter()
    return t


async def drive(
    url: str, prompts: list[list[int]], output_len: int, concurrency: int, start_at: float | None = None
):
    """c streams in flight until every prompt is done; from `start_at` (wall clock), when given."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(600)) as http:
        gate = asyncio.Semaphore(concurrency)

        async def bounded(p):
            async with gate:
                return await one_request(http, p, output_len)

        # A fresh client's first request imports and connects: in round 12 that held its other
        # streams back by up to 160 ms, a ramp the server never saw. Open every connection first.
        await asyncio.gather(*(http.get("/health") for _ in range(concurrency)))
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        start = time.perf_counter()
        timings = await asyncio.gather(*(bounded(p) for p in prompts))
        return list(timings), time.perf_counter() - start


def server_env(spec: str) -> dict[str, str]:
    """`NAME=VALUE,NAME=VALUE` (a --server-env variant) as a dict; "" is none."""
    out = {}
    for item in filter(None, spec.split(",")):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--server-env: {item!r} is not NAME=VALUE")
        out[name] = value
    return out


def start_server(
    args, port: int, log: Path, interval: int = 1, servers: int = 1, env: str = ""
) -> subprocess.Popen:
    extra = server_env(env)
    env = {**os.environ, **extra} if extra else None
    # With --access-log every request's line (its queue_ms and ttft_ms) goes to the server's log.
    logging = ["--log-level", "info"] if args.access_log else ["--no-access-log", "--log-level", "warning"]
    cmd = [sys.executable, "-m", "fastpath.serve", args.model, "--port", str(port), *logging,
           "--stream-interval", str(interval), "--api-server-count", str(servers),
           *engine_flags(args)]  # fmt: skip
    return launch_server(cmd, port, log, args.start_timeout, env)


def launch_server(
    cmd: list[str], port: int, log: Path, timeout: float, env: dict | None = None
) -> subprocess.Popen:
    """Start a server process (its output to `log`) and return it once /health answers."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the server did not start in {timeout} s:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# --- the run -------------------------------------------------------------------------------------


def engine_options(args) -> dict:
    o = {"device": args.device, "max_batch_size": max(args.concurrency), "max_seq_len": args.max_seq_len}
    if args.dtype:
        o["dtype"] = args.dtype
    if args.tokenizer:
        o["tokenizer"] = str(args.tokenizer)
    return o


def engine_flags(args) -> list[str]:
    flags = []
    for key, value in engine_options(args).items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_mix(before, after) -> dict[str, float]:
    """The engine's steps between two `LLM.stats()`, in server_means' keys: the same columns for
    offline rows as /metrics gives for the server's."""
    out = {}
    for phase in ("prefill", "decode"):
        steps = after.steps[phase] - before.steps[phase]
        seconds = after.step_seconds[phase] - before.step_seconds[phase]
        tokens = after.step_tokens[phase] - before.step_tokens[phase]
        out[f"{phase}_steps"] = steps
        out[f"{phase}_step_ms"] = seconds / steps * 1e3 if steps else 0.0
        out[f"{phase}_step_tokens"] = tokens / steps if steps else 0.0
        waited = after.step_wait_seconds[phase] - before.step_wait_seconds[phase]
        out[f"{phase}_step_wait_ms"] = waited / steps * 1e3 if steps else 0.0
    return out


def run_offline(args, prompts: list[list[int]]) -> list[dict]:
    from fastpath.runtime import LLM

    rows = []
    with LLM(args.model, **engine_options(args)) as llm:
        offline(llm, prompts[: max(args.concurrency)], args.output_len, max(args.concurrency))  # warm-up
        freeze_heap()  # as the server's processes do: neither side is timed through a full collection
        for c in args.concurrency:
            before = llm.stats()
            timings, seconds = offline(llm, prompts, args.output_len, c)
            rows.append(
                summarize("offline (engine API)", c, timings, seconds) | step_mix(before, llm.stats())
            )
            print(rows[-1], flush=True)
        before = llm.stats()
        rows.append(offline_generate(llm, prompts, args.output_len) | step_mix(before, llm.stats()))
        print(rows[-1], flush=True)
    return rows


def freeze_heap() -> None:
    import gc

    gc.collect()
    gc.freeze()


def _drive_part(
    url: str, prompts: list[list[int]], output_len: int, concurrency: int, start_at: float, part: int
):
    """One client process's share, started at a wall-clock instant common to all of them."""
    timings, seconds = asyncio.run(drive(url, prompts, output_len, concurrency, start_at))
    for t in timings:
        t.part = part
    end = time.time()
    return timings, end - seconds, end


def _ready(barrier) -> None:
    """Returns once every client process has started and imported this module: each holds one
    task at the barrier, so no process still importing torch starts its clients late. Its startup
    heap is frozen, as the server's is: a client's full collection must not stall its streams."""
    freeze_heap()
    barrier.wait(timeout=120)


def drive_from_processes(
    url: str, prompts: list[list[int]], output_len: int, concurrency: int, processes: int
):
    """c streams spread over client processes: one Python client parsing every stream's events
    would measure itself (a 1B model at 1 ms a step sends tens of thousands of events a second)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    n = max(1, min(processes, concurrency))
    if n == 1:
        return asyncio.run(drive(url, prompts, output_len, concurrency))
    shares = [concurrency // n + (i < concurrency % n) for i in range(n)]
    parts = [prompts[i::n] for i in range(n)]
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, cf.ProcessPoolExecutor(n, mp_context=ctx) as pool:
        list(pool.map(_ready, [manager.Barrier(n)] * n))  # every process up before the clock
        start_at = time.time() + 2.0  # each process connects its clients before it
        futures = [
            pool.submit(_drive_part, url, parts[i], output_len, shares[i], start_at, i) for i in range(n)
        ]
        results = [f.result() for f in futures]
    seconds = max(end for *_, end in results) - min(start for _, start, _ in results)
    return [t for timings, *_ in results for t in timings], seconds


SERVER_SIDE = {"server_ttft_mean_ms": "fastpath_time_to_first_token_seconds",
               "queue_mean_ms": "fastpath_request_queue_time_seconds"}  # fmt: skip


STEP_METRICS = ("fastpath_engine_steps_total", "fastpath_engine_step_tokens_total",
                "fastpath_engine_step_seconds_total", "fastpath_engine_step_wait_seconds_total")  # fmt: skip


def server_latencies(url: str) -> dict[str, float]:
    """The server's own histograms' sums and counts, and its step counters by phase (its /metrics),
    to tell its time from the client's."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    values = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        histogram = base.endswith(("_sum", "_count")) and base.rsplit("_", 1)[0] in SERVER_SIDE.values()
        if histogram or base in STEP_METRICS:
            values[name] = float(value)
    return values


def server_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    out = {}
    for key, metric in SERVER_SIDE.items():
        count, total = delta(f"{metric}_count"), delta(f"{metric}_sum")
        out[key] = total / count * 1e3 if count else float("nan")
    # The engine's step mix: how many steps of each phase, their mean pace and tokens.
    for phase in ("prefill", "decode"):
        label = f'{{phase="{phase}"}}'
        steps = delta(f"fastpath_engine_steps_total{label}")
        out[f"{phase}_steps"] = steps
        out[f"{phase}_step_ms"] = (
            delta(f"fastpath_engine_step_seconds_total{label}") / steps * 1e3 if steps else 0.0
        )
        out[f"{phase}_step_tokens"] = (
            delta(f"fastpath_engine_step_tokens_total{label}") / steps if steps else 0.0
        )
        out[f"{phase}_step_wait_ms"] = (
            delta(f"fastpath_engine_step_wait_seconds_total{label}") / steps * 1e3 if steps else 0.0
        )
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; 0 where it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def started(pid: int) -> int:
    """When a process started, in clock ticks since boot (/proc/<pid>/stat field 22)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def engine_pid(pid: int) -> int:
    """The engine process of server `pid`, its first child past multiprocessing's resource tracker
    (as server_cpu finds it behind several API servers); 0 when there is none."""
    kids = [k for k in children(pid) if b"resource_tracker" not in _cmdline(k)]
    return min(kids, key=started, default=0)


def server_cpu(pid: int, servers: int = 1) -> tuple[float, float]:
    """CPU seconds of the API process(es), and of the engine process. With one API server, the server
    process is it and its children are the engine's; behind several, the server process supervises, its
    first child (past multiprocessing's resource tracker) is the engine process and the rest serve HTTP."""
    kids = children(pid)
    if servers == 1:
        return cpu_seconds(pid), sum(cpu_seconds(k) for k in kids)
    kids = [k for k in kids if b"resource_tracker" not in _cmdline(k)]
    engine, *api = sorted(kids, key=started) or [0]
    return cpu_seconds(pid) + sum(cpu_seconds(k) for k in api), cpu_seconds(engine)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def run_server(
    args, prompts: list[list[int]], interval: int = 1, servers: int = 1, env: str = ""
) -> tuple[list[dict], int]:
    port = free_port()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / f"{args.name}-server-{servers}x{interval}{env_tag(env)}.log"
    proc = start_server(args, port, log, interval, servers, env)
    flags = [f"--stream-interval {interval}"] * (interval != 1) + [f"--api-server-count {servers}"] * (
        servers != 1
    )
    flags += [env] * bool(env)
    mode = f"server (HTTP, streamed{''.join(', ' + f for f in flags)})"
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        asyncio.run(drive(url, prompts[: max(args.concurrency)], args.output_len, max(args.concurrency)))
        for c in args.concurrency:
            if "FASTPATH_PHASES_OUT" in env and (engine := engine_pid(proc.pid)):
                os.kill(engine, signal.SIGUSR1)  # bench/phase_probe: only the timed run's steps count
            before, cpu0 = server_latencies(url), server_cpu(proc.pid, servers)
            timings, seconds = drive_from_processes(url, prompts, args.output_len, c, args.client_processes)
            cpu1 = server_cpu(proc.pid, servers)
            write_requests(args.out / f"{args.name}-requests-{servers}x{c}{env_tag(env)}.json", timings)
            rows.append(summarize(mode, c, timings, seconds))
            rows[-1] |= server_means(before, server_latencies(url))
            # How busy each process was: an API process near 100% of a core sets the pace.
            rows[-1]["api_cpu_share"] = (cpu1[0] - cpu0[0]) / seconds
            rows[-1]["engine_cpu_share"] = (cpu1[1] - cpu0[1]) / seconds
            rows[-1]["api_cpu_us_per_token"] = (cpu1[0] - cpu0[0]) / max(rows[-1]["output_tokens"], 1) * 1e6
            print(rows[-1], flush=True)
    finally:
        code = stop_server(proc)
    return rows, code


def env_tag(env: str) -> str:
    return "-" + re.sub(r"\W+", "_", env)[:60] if env else ""


def write_requests(path: Path, timings: list[Timing]) -> None:
    """Every request's client timeline (ms from the first send): process, sent, first and last tokens,
    [DONE]; where a run's ramp, waves and tail show."""
    t0 = min((t.sent for t in timings), default=0.0)
    rows = [[t.part, *(round((v - t0) * 1e3, 3) for v in (t.sent, t.chunks[0][0], t.chunks[-1][0], t.done)), t.tokens]
            for t in timings if t.chunks]  # fmt: skip
    path.write_text(
        json.dumps({"columns": ["process", "sent", "first", "last", "done", "tokens"], "rows": rows})
    )


def _steps(row: dict, phase: str) -> str:
    if f"{phase}_steps" not in row:
        return "-"
    wait = row.get(f"{phase}_step_wait_ms")
    waited = f", waits {wait:.2f}" if wait is not None else ""
    return f"{row[f'{phase}_steps']:.0f} ({row[f'{phase}_step_ms']:.2f}, {row[f'{phase}_step_tokens']:.1f}{waited})"


def table(rows: list[dict], generate_tok_s: float) -> str:
    headers = ["mode", "concurrency", "requests", "output tok/s", "vs offline generate",
               "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "request mean ms", "slot idle mean ms",
               "server: TTFT mean ms",
               "server: queue mean ms", "prefill steps (ms, tokens each, ms waiting for the device)",
               "decode steps (ms, rows each, ms waiting for the device)",
               "API / engine process CPU (cores)"]  # fmt: skip
    body = [
        [r["mode"], r["concurrency"], r["requests"], f"{r['output_tok_s']:.0f}",
         f"{r['output_tok_s'] / generate_tok_s:.1%}", f"{r['ttft_p50_ms']:.1f}", f"{r['ttft_p99_ms']:.1f}",
         f"{r['itl_p50_ms']:.2f}", f"{r['itl_p99_ms']:.2f}",
         f"{r.get('request_mean_ms', float('nan')):.1f}", f"{r.get('slot_idle_mean_ms', float('nan')):.1f}",
         f"{r['server_ttft_mean_ms']:.1f}" if "server_ttft_mean_ms" in r else "-",
         f"{r['queue_mean_ms']:.1f}" if "queue_mean_ms" in r else "-",
         _steps(r, "prefill"), _steps(r, "decode"),
         f"{r['api_cpu_share']:.2f} / {r['engine_cpu_share']:.2f}" if "api_cpu_share" in r else "-"]
        for r in rows
    ]  # fmt: skip
    return markdown_table(headers, body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--name", default="serve", help="the result files' stem")
    ap.add_argument("--model", default="random:llama-1b")
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer folder (the random 1.2B Llama has none)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--requests", type=int, default=256, help="requests per concurrency")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument(
        "--client-processes", type=int, default=8, help="processes the HTTP clients are spread over"
    )
    ap.add_argument(
        "--stream-interval", type=int, nargs="+", default=[1],
        help="the server's --stream-interval; several run one server each, side by side",
    )  # fmt: skip
    ap.add_argument(
        "--api-server-count", type=int, nargs="+", default=[1],
        help="the server's --api-server-count; several run one server each, side by side",
    )  # fmt: skip
    ap.add_argument(
        "--server-env", nargs="+", default=[""], metavar="NAME=VALUE[,NAME=VALUE]",
        help="environment for the server's processes (FASTPATH_GIL_SWITCH_US=0, FASTPATH_ADMIT_BESIDE=0, ...); "
        "several run one server each, side by side",
    )  # fmt: skip
    ap.add_argument(
        "--access-log", action="store_true",
        help="each server logs every request (queue_ms, ttft_ms) into its <name>-server-*.log",
    )  # fmt: skip
    ap.add_argument(
        "--quick", action="store_true", help="a tiny random model on the CPU: the bench's smoke test"
    )
    args = ap.parse_args()
    if args.quick:
        args.model, args.device, args.requests = "random:tiny-llama", "cpu", 32
        args.input_len, args.output_len, args.max_seq_len = 16, 16, 128
        args.concurrency = [1, 16]
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    prompts = make_prompts(args.requests, args.input_len, vocab=500 if args.quick else 30000)

    offline_rows = run_offline(args, prompts)
    server_rows, codes = [], []
    for interval in args.stream_interval:
        for servers in args.api_server_count:
            for env in args.server_env:
                rows_k, code = run_server(args, prompts, interval, servers, env)
                server_rows += rows_k
                codes.append(code)
    exit_code = max(codes, key=abs)
    generate_tok_s = offline_rows[-1]["output_tok_s"]
    by_c = {r["concurrency"]: r for r in offline_rows}
    rows = [
        row for c in args.concurrency for row in (by_c[c], *(r for r in server_rows if r["concurrency"] == c))
    ]
    rows.append(offline_rows[-1])
    top = max(args.concurrency)
    server_top = max((r for r in server_rows if r["concurrency"] == top), key=lambda r: r["output_tok_s"])
    ratio = server_top["output_tok_s"] / generate_tok_s
    verdict = (
        f"At concurrency {top} the best server ({server_top['mode']}) has {ratio:.1%} of offline generate's "
        f"output throughput (target: at least 95%); every server exited with 0 after SIGTERM: "
        f"{exit_code == 0} (worst code {exit_code})."
    )
    setup = (f"model {args.model}, device {args.device}, {args.requests} requests of {args.input_len} prompt "
             f"tokens and {args.output_len} output tokens (ignore_eos, greedy), max_batch_size {top}")  # fmt: skip
    payload = {"env": environment(), "setup": vars(args) | {"out": str(args.out)}, "rows": rows,
               "server_vs_generate": ratio, "server_exit_code": exit_code}  # fmt: skip
    payload["setup"]["tokenizer"] = str(args.tokenizer) if args.tokenizer else None
    text = f"{table(rows, generate_tok_s)}\n\n{setup}.\n\n{verdict}"
    write_outputs(args.out, f"{args.name}-quick" if args.quick else args.name, payload, text)


if __name__ == "__main__":
    main()
