#!/usr/bin/env python3
"""The host's share of a decode step: the engine's loop with a runner that returns at once.

    python bench/host_step.py --out bench/results [--batch 1 8 64 256]

The device is taken out (the runner's run_decode and run_prefill return fixed tokens without
launching anything), so what is left per step is scheduling, staging, read-back bookkeeping and
completion: the part the host must finish within the GPU's step for the GPU to set the pace.
Steady-state time per step is the difference of two generations that differ only in length.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, write_outputs
from stub_device import stub_runner


def host_step_us(batch: int, repeats: int, sampled: bool = False) -> tuple[float, float]:
    """(wall µs per step, the engine's own µs per decode step): the wall time also holds the
    caller's work per token (building outputs), the engine's clock only the loop's."""
    from decode import SAMPLED

    from fastpath.runtime import LLM, SamplingParams

    llm = LLM(
        "random:tiny-llama",
        device="cpu",
        max_batch_size=batch,
        max_seq_len=512,
        kv_cache_blocks=batch * 16 + 64,
    )
    stub_runner(llm.executor.runner)
    prompts = [[5 + i % 50] * 16 for i in range(batch)]

    engine = []

    def run(n: int) -> float:
        start, before = time.perf_counter(), llm.stats()
        fields = SAMPLED if sampled else {"temperature": 0.0}
        params = SamplingParams(**fields, max_tokens=n, ignore_eos=True)
        llm.generate(prompts, params, use_tqdm=False)
        wall, after = time.perf_counter() - start, llm.stats()
        steps = after.steps["decode"] - before.steps["decode"]
        engine.append((after.step_seconds["decode"] - before.step_seconds["decode"]) / max(steps, 1))
        return wall

    run(4)
    diffs = []
    for _ in range(repeats):
        diffs.append((run(200) - run(40)) / 160)
    long_runs = engine[1::2]  # the 200-token runs: the collector's cost grows with what requests keep
    llm.close()
    return statistics.median(diffs) * 1e6, statistics.median(long_runs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--sampling", nargs="+", choices=["greedy", "penalties"], default=["greedy"],
        help="greedy, and/or decode.py's sampled-with-penalties parameters (top-5 logprobs included)",
    )  # fmt: skip
    args = parser.parse_args()
    rows, payload = [], {"environment": environment(), "rows": []}
    for sampling in args.sampling:
        for batch in args.batch:
            us, loop_us = host_step_us(batch, args.repeats, sampled=sampling == "penalties")
            rows.append([sampling, batch, f"{us:.0f}", f"{us / batch:.2f}", f"{loop_us:.0f}"])
            payload["rows"].append(
                {
                    "sampling": sampling,
                    "batch": batch,
                    "host_us_per_step": us,
                    "engine_loop_us_per_step": loop_us,
                }
            )
            print(f"{sampling}, batch {batch}: {us:.0f} us of host work per decode step", flush=True)
    table = markdown_table(
        ["sampling", "batch", "host µs/step", "host µs/sequence", "engine loop µs/step (200-token runs)"],
        rows,
    )
    print(table)
    write_outputs(args.out, "host_step", payload, table)


if __name__ == "__main__":
    main()
