#!/usr/bin/env python3
"""What serving costs the host per output token, without a GPU: CPU time of the API process (HTTP,
SSE, outputs) and of the engine process, per token streamed at concurrency c.

    python bench/serve_cpu.py [--out DIR] [--concurrency 64] [--requests 256] [--step-us 1000]
                              [--prefill-us US] [--token-us US] [--generate]

The server is the real one (uvicorn, the OpenAI routes, the engine in its own process), but its
device is bench/stub_device.py's clock: steps of `--step-us` (a prefill step `--prefill-us` more and
`--token-us` per padded token) run one after another while the host goes on, and return token 7.
Clients run in `--client-processes` processes (bench/serve.py's). At a 1 ms step and 64 streams the
API process must turn 64,000 tokens a second into SSE; its CPU µs per token says how far one
process is from that, whatever machine runs the bench. `--generate` adds offline `generate` on the
same stub, so the server's share of it (#17's figure) and the step mix behind it show on the CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, write_outputs
from stub_device import SleepingExecutor

from serve import (
    drive_from_processes,
    free_port,
    launch_server,
    make_prompts,
    server_cpu,
    server_latencies,
    server_means,
    stop_server,
    summarize,
)

SERVER = """
import sys
sys.path.insert(0, {bench!r})
from stub_device import SleepingExecutor
from fastpath.runtime import LLM
from fastpath.runtime.serve.cli import configure_logging
from fastpath.runtime.serve.config import ServeConfig
from fastpath.runtime.serve.server import serve

if __name__ == "__main__":
    configure_logging("warning")
    if {profile!r}:  # the API process's event loop (main thread), written out when the server exits
        import atexit, cProfile
        prof = cProfile.Profile()
        prof.enable()
        atexit.register(lambda: (prof.disable(), prof.dump_stats({profile!r})))
    config = ServeConfig(port={port}, access_log=False, stream_interval={interval}, api_server_count={servers})
    with LLM({model!r}, device="cpu", max_batch_size={batch}, max_seq_len={seq}, kv_cache_blocks={blocks},
             engine_process={remote}, executor_cls=SleepingExecutor) as llm:
        if config.api_server_count > 1:
            from fastpath.runtime.serve.api_servers import serve_many
            serve_many(llm, config, log_level="warning")
        else:
            serve(llm, config)
"""
MODES = {"in-process": (False, 1), "engine-process": (True, 1), "api-servers": (True, None)}


def run(args, mode: str) -> dict:
    remote, servers = MODES[mode]
    servers = servers or args.api_server_count
    port = free_port()
    blocks = args.concurrency * (-(-(args.input_len + args.output_len) // 16) + 1) + 64
    script = SERVER.format(bench=str(Path(__file__).resolve().parent), model=args.model, batch=args.concurrency,
                           seq=args.input_len + args.output_len + 16, blocks=blocks, remote=remote, port=port, interval=args.stream_interval, servers=servers,
                           profile=str(args.profile.resolve()) + f".{int(remote)}" if args.profile else "")  # fmt: skip
    env = {**os.environ, **stub_env(args)}
    args.out.mkdir(parents=True, exist_ok=True)
    server = launch_server([sys.executable, "-c", script], port, args.out / "serve_cpu-server.log", 120, env)
    url = f"http://127.0.0.1:{port}"
    try:
        prompts = make_prompts(args.requests, args.input_len, vocab=500)
        drive_from_processes(
            url, prompts[: args.concurrency], args.output_len, args.concurrency, args.client_processes
        )
        before, steps = server_cpu(server.pid, servers), server_latencies(url)
        timings, seconds = drive_from_processes(
            url, prompts, args.output_len, args.concurrency, args.client_processes
        )
        after, steps = server_cpu(server.pid, servers), server_means(steps, server_latencies(url))
    finally:
        stop_server(server)
    label = {"in-process": "in process", "engine-process": "engine process"}.get(
        mode, f"{servers} API servers"
    )
    row = summarize(label, args.concurrency, timings, seconds) | steps
    tokens = row["output_tokens"]
    row["api_cpu_us_per_token"] = (after[0] - before[0]) / tokens * 1e6
    row["engine_cpu_us_per_token"] = (after[1] - before[1]) / tokens * 1e6 if remote else None
    return row


def stub_env(args) -> dict[str, str]:
    return {"FASTPATH_STUB_STEP_US": str(args.step_us), "FASTPATH_STUB_PREFILL_US": str(args.prefill_us),
            "FASTPATH_STUB_TOKEN_US": str(args.token_us)}  # fmt: skip


def generate_row(args) -> dict:
    """One offline `generate` of every request on the same stub device: the engine's own ceiling."""
    os.environ.update(stub_env(args))
    from fastpath.runtime import LLM, SamplingParams

    blocks = args.concurrency * (-(-(args.input_len + args.output_len) // 16) + 1) + 64
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    prompts = make_prompts(args.requests, args.input_len, vocab=500)
    with LLM(args.model, device="cpu", max_batch_size=args.concurrency, max_seq_len=args.input_len + args.output_len + 16,
             kv_cache_blocks=blocks, executor_cls=SleepingExecutor) as llm:  # fmt: skip
        llm.generate(prompts[: args.concurrency], params, use_tqdm=False)  # warm-up
        before = llm.stats()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        after = llm.stats()
    row = {"mode": "offline generate", "output_tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / seconds,
           "ttft_p50_ms": float("nan"), "itl_p50_ms": float("nan"), "api_cpu_us_per_token": float("nan"),
           "engine_cpu_us_per_token": None}  # fmt: skip
    for phase in ("prefill", "decode"):
        steps = after.steps[phase] - before.steps[phase]
        row[f"{phase}_steps"] = steps
        row[f"{phase}_step_ms"] = (
            (after.step_seconds[phase] - before.step_seconds[phase]) / max(steps, 1) * 1e3
        )
        row[f"{phase}_step_tokens"] = (after.step_tokens[phase] - before.step_tokens[phase]) / max(steps, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--model", default="random:tiny-llama", help="its tokenizer is used; its weights are not")
    ap.add_argument("--step-us", type=float, default=1000.0)
    ap.add_argument("--prefill-us", type=float, default=0.0, help="what a prefill step costs beyond a step")
    ap.add_argument("--token-us", type=float, default=0.0, help="and per (padded) prompt token")
    ap.add_argument("--generate", action="store_true", help="add offline generate's row on the same stub")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--client-processes", type=int, default=2)
    ap.add_argument("--stream-interval", type=int, default=1, help="the server's --stream-interval")
    ap.add_argument(
        "--profile",
        type=Path,
        help="cProfile the API process's main thread into PATH.0 / PATH.1 (not the api-servers mode)",
    )
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=["in-process", "engine-process"])
    ap.add_argument(
        "--api-server-count", type=int, default=2, help="API server processes of the api-servers mode"
    )
    args = ap.parse_args()
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    rows = [run(args, mode) for mode in args.modes]
    if args.generate:
        rows.append(generate_row(args))
        for r in rows:
            r["vs_generate"] = r["output_tok_s"] / rows[-1]["output_tok_s"]
    for r in rows:
        print(r, flush=True)
    body = [[r["mode"], f"{r['output_tok_s']:.0f}", f"{r.get('vs_generate', float('nan')):.1%}",
             f"{r['ttft_p50_ms']:.1f}", f"{r['itl_p50_ms']:.2f}",
             f"{r['prefill_steps']:.0f} ({r['prefill_step_ms']:.2f}, {r['prefill_step_tokens']:.0f})",
             f"{r['decode_steps']:.0f} ({r['decode_step_ms']:.2f}, {r['decode_step_tokens']:.1f})",
             f"{r['api_cpu_us_per_token']:.1f}",
             "-" if r["engine_cpu_us_per_token"] is None else f"{r['engine_cpu_us_per_token']:.1f}"]
            for r in rows]  # fmt: skip
    text = markdown_table(
        ["engine loop", "output tok/s", "vs generate", "TTFT p50 ms", "ITL p50 ms", "prefill steps (ms, tokens)",
         "decode steps (ms, rows)", "API processes CPU µs/token",
         "engine process CPU µs/token"], body,
    )  # fmt: skip
    text += (f"\n\n{args.requests} streamed requests of {args.input_len} + {args.output_len} tokens at concurrency "
             f"{args.concurrency}, stream interval {args.stream_interval}, a {args.step_us:.0f} µs stub device step (prefill: {args.prefill_us:.0f} µs more and {args.token_us:g} µs a padded token), clients in {args.client_processes} "
             f"processes; {os.cpu_count()} CPU cores.")  # fmt: skip
    write_outputs(args.out, "serve_cpu", {"env": environment(), "setup": vars(args) | {"out": str(args.out), "profile": str(args.profile)},
                                         "rows": rows}, text)  # fmt: skip
    print(text)


if __name__ == "__main__":
    main()
