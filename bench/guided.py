#!/usr/bin/env python3
"""Per-step decode latency with and without guided decoding, per host-dispatch mode, in one run.

    python bench/guided.py --out DIR [--tokenizer DIR] [--backends xgrammar llguidance] [--quick]
                           [--fill-threads 1 4 8]

The model is the random 1.2B Llama; the tokenizer a byte-level BPE trained here on a synthetic
corpus (32k tokens unless --tokenizer gives one), so the grammar backend computes real masks. Guided requests
follow an endless JSON-lines regex, so they run as long as free ones do (ignore_eos, max_tokens).
The grammar work runs in a host callback captured in the decode graph; its wake-up latency is
what the dispatch mode changes.

Columns: greedy steps free and guided (the overhead the issue targets) and the host time inside
the fill callback (mean, and p50/p90/max over the guided steps); the guided path with the backend's
calls taken out (callback, copies, mask); and the same with temperature 1.0, which runs the general
sampler. With --fill-threads, the guided columns are measured once per thread count of the C++
fill, in the same engine (GuidedFill.set_threads); the free and no-grammar columns once. "Host"
gives each backend's fill alone on this host: xgrammar row by row (the engine's way) and through its
thread pool, llguidance through its parallel call (the engine's way for it).

The fill's cost is the grammar state's: in this regex, a row four letters into "name"'s [a-z]{1,8}
costs about 650 µs (xgrammar checks 8k tokens there), any other about 3 µs. A step's fill is as
long as its expensive rows, spread over the fill's threads; it is hidden while it is shorter than
the forward it runs beside.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import counted_run, environment, markdown_table, write_outputs

MODEL = "random:llama-1b"
ENDLESS_JSON = r'(\{"id": [0-9]{1,4}, "name": "[a-z]{1,8}", "ok": (true|false)\}\n)+'


def tokenizer_dir(path: Path | None, out: Path) -> Path:
    if path is not None:
        return path
    from fastpath.runtime.model.tiny_checkpoint import synthetic_corpus, train_tokenizer

    target = out / "bench-tokenizer-32k"
    if not (target / "tokenizer.json").is_file():
        train_tokenizer(32000, synthetic_corpus(40000)).save_pretrained(target)
    return target


def step_time(
    llm, batch: int, guided: bool, short: int, long: int, repeats: int, temperature: float = 0.0
) -> float:
    """Median over repeats of the engine's counted decode seconds of a long run less a short one's,
    over the steps between them (bench/decode.py's step). The difference of two runs' wall times,
    used before, swung by more than the overhead measured (once below zero)."""
    from fastpath.runtime import SamplingParams

    prompts = [[1000 + 7 * i + j for j in range(16)] for i in range(batch)]

    def params(n):
        spec = {"regex": ENDLESS_JSON} if guided else None
        return SamplingParams(max_tokens=n, ignore_eos=True, temperature=temperature, seed=0, guided=spec)

    def run(n):
        return counted_run(llm, lambda: llm.generate(prompts, params(n)))

    run(short)
    steps = []
    for _ in range(repeats):
        _, counted_long, _, steps_long = run(long)
        _, counted_short, _, steps_short = run(short)
        steps.append((counted_long - counted_short) / max(steps_long - steps_short, 1))
    return statistics.median(steps)


def percentiles(durations_us: list[float]) -> dict[str, float]:
    """Mean, p50, p90 and max of the fills' durations; zeros when there were none."""
    if not durations_us:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "max": 0.0}
    ordered = sorted(durations_us)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"mean": statistics.fmean(ordered), "p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1]}


@contextmanager
def fill_log(guided):
    """The fill's decode-step durations (µs) recorded while the block runs (the last 4096 at most)."""
    durations: list[float] = []
    filler = guided.filler
    steps = filler.steps
    yield durations
    new = filler.steps - steps
    if new:
        durations.extend(filler.step_durations_us()[-new:])  # the ring keeps the last 4096


@contextmanager
def without_grammar_work(guided):
    """The guided path with the backend's calls taken out: every row planned free; callback, copies, mask remain."""
    enqueue = guided.enqueue
    free_fill = guided.filler.fill
    guided.enqueue = lambda seqs, total: enqueue([None] * len(seqs), total)
    guided.fill_on_host = lambda seqs: free_fill([None] * len(seqs))
    try:
        yield
    finally:
        del guided.enqueue, guided.fill_on_host


def fill_alone(guided, batch: int, calls=None, steps: int = 200) -> float:
    """Mean µs for one step's fill of `batch` rows, on the host alone (no GPU, no engine thread)."""
    calls = calls or guided.calls
    import random

    import numpy as np

    from fastpath.runtime.guided.spec import parse_spec

    rng = random.Random(0)
    matchers = [guided.state_for(parse_spec({"regex": ENDLESS_JSON})).matcher for _ in range(batch)]
    mask = np.full((batch, guided.words), -1, dtype=np.int32)
    rows, total = list(range(batch)), 0.0
    for _ in range(steps):
        start = time.perf_counter()
        calls.fill(matchers, mask, rows)
        total += time.perf_counter() - start
        bits = np.unpackbits(mask.view(np.uint8), axis=1, bitorder="little")[:, : guided.vocab_size]
        for r, m in enumerate(matchers):
            allowed = np.flatnonzero(bits[r]).tolist()
            calls.accept(m, rng.choice([t for t in allowed if t > 2] or allowed))
    return total / steps * 1e6


def fill_alone_native(g, batch: int, threads: int, steps: int = 200) -> float | None:
    """As fill_alone, through the C++ fill (guided_fill.hpp) with its rows over `threads` threads;
    None where the fill is not native."""
    if g.fill != "native":
        return None
    import random

    import numpy as np
    import torch

    from fastpath.runtime.guided.spec import parse_spec

    rng = random.Random(0)
    states = [g.state_for(parse_spec({"regex": ENDLESS_JSON})) for _ in range(batch)]
    tokens = torch.zeros(batch, dtype=torch.int64)
    mask = torch.full((batch, g.words), -1, dtype=torch.int32)
    flags = torch.zeros(batch, dtype=torch.int32)
    filler = g._extension.GuidedFill(tokens, mask, flags, batch, g.words, threads=threads)
    rows, total = [s.row for s in states], 0.0
    for _ in range(steps):
        start = time.perf_counter()
        filler.fill(rows)
        total += time.perf_counter() - start
        bits = np.unpackbits(mask.numpy().view(np.uint8), axis=1, bitorder="little")[:, : g.vocab_size]
        for r, s in enumerate(states):
            allowed = np.flatnonzero(bits[r]).tolist()
            g.calls.accept(s.matcher, rng.choice([t for t in allowed if t > 2] or allowed))
    return total / steps * 1e6


def host_line(g, batches: list[int]) -> dict:
    """The fill alone on this host, for the engine's guided decoder `g`."""
    from fastpath.runtime.guided.matcher_calls import MatcherCalls, usable_cpus

    host = {"fill": g.fill, "holds_gil": g.calls.holds_gil, "threads": g.calls.threads,
            "usable_cpus": usable_cpus(), "os_cpu_count": os.cpu_count(),
            "fill_alone_us": {b: fill_alone(g, b) for b in batches}}  # fmt: skip
    if g.backend.name == "xgrammar":
        host["fill_alone_pool_us"] = {b: fill_alone(g, b, MatcherCalls("auto")) for b in batches}
        # The C++ fill over 1, 2 and 4 threads (FASTPATH_GUIDED_FILL_THREADS).
        host["fill_alone_native_us"] = {
            b: {t: fill_alone_native(g, b, t) for t in (1, 2, 4)} for b in batches
        }
    return host


def measure(
    llm, grammar: str, mode: str, b: int, timing: tuple[int, int, int], fill_threads: list[int] | None = None
) -> tuple[list[dict], list[list]]:
    """Rows for one batch: free and guided steps, greedy and sampled, and the guided path without
    grammar work; one row per fill thread count (None: the engine's own)."""
    backend = llm.executor.dispatcher.backend
    ring = llm.executor.dispatcher.info().get("ring", "none")
    g = llm.executor.guided
    free = step_time(llm, b, False, *timing)
    sampled = step_time(llm, b, False, *timing, temperature=1.0)
    with without_grammar_work(g):
        plumbing = step_time(llm, b, True, *timing)
        plumbing_sampled = step_time(llm, b, True, *timing, temperature=1.0)
    records, rows, own = [], [], g.fill_threads
    for threads in fill_threads or [None]:
        if threads is not None:
            g.filler.set_threads(threads)
        with fill_log(g) as durations:
            guided = step_time(llm, b, True, *timing)
        with fill_log(g) as durations_sampled:
            guided_sampled = step_time(llm, b, True, *timing, temperature=1.0)
        spread, spread_sampled = percentiles(durations), percentiles(durations_sampled)
        fill_us = spread["mean"]  # per decode step, inside its callback (prefill fills not counted)
        r = {"grammar": grammar, "mode": mode, "backend": backend, "ring": ring, "batch": b,
             "fill_threads": g.fill_threads, "free_s": free, "guided_s": guided, "host_fill_us": fill_us,
             "fill_us": spread, "free_sampled_s": sampled, "guided_sampled_s": guided_sampled,
             "fill_sampled_us": spread_sampled, "guided_no_grammar_s": plumbing,
             "guided_sampled_no_grammar_s": plumbing_sampled}  # fmt: skip
        row = [grammar, mode, backend, ring, b, g.fill_threads, f"{free * 1e6:.0f}", f"{guided * 1e6:.0f}",
               f"{guided / free - 1:+.1%}", f"{fill_us:.0f}", _spread(spread), f"{plumbing * 1e6:.0f}",
               f"{sampled * 1e6:.0f}", f"{guided_sampled * 1e6:.0f}", f"{guided_sampled / sampled - 1:+.1%}",
               _spread(spread_sampled), f"{plumbing_sampled * 1e6:.0f}"]  # fmt: skip
        records.append(r)
        rows.append(row)
    if fill_threads:
        g.filler.set_threads(own)  # the next batch's rows start from the engine's own count
    return records, rows


def _spread(p: dict[str, float]) -> str:
    return f"{p['p50']:.0f} / {p['p90']:.0f} / {p['max']:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--modes", nargs="+", default=["blocking", "spin"])
    ap.add_argument("--backends", nargs="+", default=["xgrammar"], choices=["xgrammar", "llguidance"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--name", default="guided", help="the output files' stem")
    ap.add_argument(
        "--fill-threads",
        type=int,
        nargs="+",
        help="measure the guided columns once per C++ fill thread count (default: the engine's own)",
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/guided.py needs a CUDA device; none is visible")
        return
    from fastpath.runtime import LLM

    tok = tokenizer_dir(args.tokenizer, args.out)
    # Three repeats even when quick: the median of two let one stalled run (4,831 µs a step against
    # 1,185, round 18 call 2) through.
    timing = (8, 40, 3) if args.quick else (16, 176, 5)
    rows, payload = [], {"env": environment(), "rows": [], "host": {}}
    for grammar in args.backends:
        for mode in args.modes:
            llm = LLM(MODEL, device="cuda", dtype="bfloat16", max_batch_size=max(args.batch), max_seq_len=256,
                      tokenizer=tok, guided_backend=grammar, dispatch_mode=mode)  # fmt: skip
            if mode == args.modes[0]:
                payload["host"][grammar] = host_line(llm.executor.guided, args.batch)
                print(f"host ({grammar}):", payload["host"][grammar], flush=True)
            threads = args.fill_threads if llm.executor.guided.fill == "native" else None
            for b in args.batch:
                records, table_rows = measure(llm, grammar, mode, b, timing, threads)
                payload["rows"].extend(records)
                rows.extend(table_rows)
                for row in table_rows:
                    print(row, flush=True)
            llm.close()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    headers = [
        "grammar",
        "mode",
        "backend",
        "ring",
        "batch",
        "fill threads",
        "free µs/step",
        "guided µs/step",
        "overhead",
        "host fill µs/step",
        "fill p50 / p90 / max µs",
        "guided, no grammar work",
        "free, sampled",
        "guided, sampled",
        "overhead, sampled",
        "fill p50 / p90 / max µs, sampled",
        "guided, sampled, no grammar work",
    ]
    table = markdown_table(headers, rows) + f"\n\nHost: {payload['host']}\n"
    write_outputs(args.out, args.name, payload, table)


if __name__ == "__main__":
    main()
