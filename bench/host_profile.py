#!/usr/bin/env python3
"""Where a decode step's host time goes, on the engine's loop thread and the caller's (cProfile).

    python bench/host_profile.py --out DIR [--batch 64] [--sampling greedy penalties] [--tokens 40]

On the H200, decode.py's sampled-with-penalties row at batch 64 took 8.2 ms a step on the wall
against a 1.4 ms graph replay, while greedy took 1.3 ms: this says which Python does it. Each
run is one `generate` of `--tokens` tokens per row; the engine's own step accounting is printed
beside the profiles (its decode steps' mean wall time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import PROMPT_LEN, SAMPLED


def top(prof: cProfile.Profile, n: int) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--model", default="random:llama-1b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--sampling", nargs="+", choices=["greedy", "penalties"], default=["greedy", "penalties"])
    ap.add_argument("--lines", type=int, default=25)
    args = ap.parse_args()
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    from fastpath.runtime import LLM, SamplingParams
    from fastpath.runtime.engine.core import EngineCore

    # The loop thread's work, profiled from inside it: each step of the executor's loop, and the
    # delivery of its outputs. (cProfile follows only the thread that enables it.)
    armed: dict[str, cProfile.Profile | None] = {"loop": None}
    deliver = EngineCore._deliver

    def profiled_steps(gen):
        while True:
            prof = armed["loop"]
            if prof is not None:
                prof.enable()
            try:
                record = next(gen)
            except StopIteration:
                return
            finally:
                if prof is not None:
                    prof.disable()
            yield record

    def profiled_deliver(self, record):
        prof = armed["loop"]
        if prof is not None:
            prof.enable()
        try:
            return deliver(self, record)
        finally:
            if prof is not None:
                prof.disable()

    EngineCore._deliver = profiled_deliver
    cuda = torch.cuda.is_available()
    llm = LLM(args.model, device="cuda" if cuda else "cpu", max_batch_size=args.batch, max_seq_len=512)
    executor_steps = llm.executor.steps  # the loop asks for a fresh generator per batch of work
    llm.executor.steps = lambda: profiled_steps(executor_steps())
    vocab = llm.config.model.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (PROMPT_LEN,), generator=g).tolist() for _ in range(args.batch)]
    report = []
    for kind in args.sampling:
        extra = SAMPLED if kind == "penalties" else {"temperature": 0.0}
        params = [
            SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=i, **extra)
            for i in range(args.batch)
        ]
        llm.generate(prompts, params, use_tqdm=False)  # warm
        # From Python 3.12 a profiler sees every thread (sys.monitoring), and only one may run.
        every_thread = sys.version_info >= (3, 12)
        caller = cProfile.Profile()
        armed["loop"] = loop = None if every_thread else cProfile.Profile()
        before = llm.stats()
        t0 = time.perf_counter()
        caller.enable()
        llm.generate(prompts, params, use_tqdm=False)
        caller.disable()
        wall = time.perf_counter() - t0
        armed["loop"] = None
        after = llm.stats()
        n = after.steps["decode"] - before.steps["decode"]
        secs = after.step_seconds["decode"] - before.step_seconds["decode"]
        head = (f"## {kind}, batch {args.batch}: {wall * 1e3:.1f} ms for {args.tokens} tokens; "
                f"{n} decode steps at {secs / max(n, 1) * 1e6:.0f} µs (engine's count)")  # fmt: skip
        report += [
            head,
            "### engine loop thread",
            top(loop, args.lines),
            "### caller thread",
            top(caller, 12),
        ]
        print(head, flush=True)
    llm.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_profile.txt").write_text("\n\n".join(report) + "\n")
    print("\n".join(report)[:6000])


if __name__ == "__main__":
    main()
