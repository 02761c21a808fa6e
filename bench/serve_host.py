#!/usr/bin/env python3
"""The serving gap without a GPU: the engine's loop with a device step that is a GIL-free sleep.

    python bench/serve_host.py [--out DIR] [--step-us 1200] [--concurrency 64] [--requests 128]

On the H200, `bench/serve.py` found the engine API at concurrency 64 at 43% of one `generate`
call, with inter-token latency near 5 ms against a 1.2 ms decode step. This bench rebuilds that
regime on any machine: the runner's decode and prefill return at once after sleeping for the
device's step time with the GIL released, as a CUDA synchronize does, so what remains is the
host: the engine's loop thread and the consumers of its outputs, sharing one GIL.

Three ways to consume the same requests (prompt ids, `ignore_eos`, greedy):
- `generate`: one call, no per-token consumer (the ceiling);
- `threads`: c threads, each iterating its request's stream (the offline engine API);
- `asyncio`: one event loop with c tasks, each iterating `submit(loop=...)` and encoding a JSON
  chunk per output (what the HTTP server does per SSE event, without the socket).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, write_outputs
from stub_device import SleepingExecutor


def by_generate(llm, prompts, params, concurrency) -> list[float]:
    llm.generate(prompts, params, use_tqdm=False)
    return []


def by_threads(llm, prompts, params, concurrency) -> list[float]:
    queue, lock, gaps = list(prompts), threading.Lock(), []

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                prompt = queue.pop()
            last = None
            for _ in llm.submit(prompt, params):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return gaps


def by_asyncio(llm, prompts, params, concurrency) -> list[float]:
    gaps: list[float] = []

    async def main() -> None:
        loop, queue = asyncio.get_running_loop(), list(prompts)

        async def worker() -> None:
            while queue:
                prompt, last = queue.pop(), None
                async for out in llm.submit(prompt, params, loop=loop):
                    c = out.outputs[0]
                    json.dumps({"choices": [{"index": 0, "text": c.text, "token_ids": c.token_ids}]})
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(main())
    return gaps


WAYS = {"generate": by_generate, "threads": by_threads, "asyncio": by_asyncio}
# (engine, ways): the engine's loop beside its consumers, then in a process of its own
RUNS = (("in process", ("generate", "threads", "asyncio")), ("engine process", ("threads", "asyncio")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--model", default="random:tiny-llama", help="its tokenizer is used; its weights are not")
    ap.add_argument("--step-us", type=float, default=1200.0, help="the device's decode step")
    ap.add_argument("--prefill-us", type=float, default=5000.0, help="the device's prefill step")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    os.environ["FASTPATH_STUB_STEP_US"] = str(args.step_us)  # read by SleepingExecutor in the child
    os.environ["FASTPATH_STUB_PREFILL_US"] = str(max(0.0, args.prefill_us - args.step_us))  # beyond a step
    from fastpath.runtime import LLM, SamplingParams

    prompts = [[5 + (i + j) % 200 for j in range(args.input_len)] for i in range(args.requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    blocks = args.concurrency * (-(-(args.input_len + args.output_len) // 16) + 1) + 64
    rows = []
    for engine, ways in RUNS:
        remote = engine == "engine process"
        with LLM(args.model, device="cpu", max_batch_size=args.concurrency, max_seq_len=args.input_len +
                 args.output_len + 16, kv_cache_blocks=blocks, engine_process=remote,
                 executor_cls=SleepingExecutor) as llm:  # fmt: skip
            llm.generate(
                prompts[:4], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False
            )
            for name in ways:
                start = time.perf_counter()
                gaps = WAYS[name](llm, prompts, params, args.concurrency)
                seconds = time.perf_counter() - start
                rows.append({
                    "engine": engine, "way": name, "seconds": seconds,
                    "output_tok_s": args.requests * args.output_len / seconds,
                    "itl_p50_ms": statistics.median(gaps) * 1e3 if gaps else None,
                })  # fmt: skip
                print(rows[-1], flush=True)
    ceiling = rows[0]["output_tok_s"]
    body = [[r["engine"], r["way"], f"{r['output_tok_s']:.0f}", f"{r['output_tok_s'] / ceiling:.1%}",
             "-" if r["itl_p50_ms"] is None else f"{r['itl_p50_ms']:.2f}"] for r in rows]  # fmt: skip
    text = markdown_table(["engine loop", "consumers", "output tok/s", "vs generate", "ITL p50 ms"], body)
    text += (f"\n\n{args.requests} requests of {args.input_len} + {args.output_len} tokens, concurrency "
             f"{args.concurrency}, a {args.step_us:.0f} µs device step as a GIL-free sleep.")  # fmt: skip
    write_outputs(args.out, "serve_host", {"env": environment(), "setup": vars(args) | {"out": str(args.out)},
                                          "rows": rows}, text)  # fmt: skip


if __name__ == "__main__":
    main()
