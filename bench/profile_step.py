#!/usr/bin/env python3
"""Where a decode step's time goes: kernel times inside graph replays, grouped (each linear alone: bench/linear.py).

python bench/profile_step.py --out DIR [--batch 1 8]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import markdown_table, replay_seconds, write_outputs

GROUPS = [
    ("gemv", ("gemv", "gemm_small", "gemm", "cutlass", "sm90_xmma", "nvjet", "ampere", "sgemm")),
    ("attention", ("split_kernel", "reduce_kernel", "attention", "fmha", "flash")),
    ("norm", ("rms_norm",)),
    ("rope+kv", ("qkv_rope",)),
    ("silu", ("silu",)),
    (
        "sampler",
        (
            "argmax",
            "softmax",
            "reduce",
            "gather",
            "max",
            "stats_kernel",
            "hist_kernel",
            "select_kernel",
            "draw_kernel",
            "decide_kernel",
            "final_kernel",
            "index_put",
            "scatter",
        ),
    ),
]


def group_of(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in GROUPS if any(k in low for k in keys)), "other")


def profile_graph(llm, rows: int, replays: int = 20, kind: str = "greedy") -> dict:
    graphs = llm.executor.graphs
    g = graphs.graphs[(rows, kind)].graph
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    per_kernel = collections.Counter()
    counts = collections.Counter()
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[evt.name] += evt.device_time_total / replays
            counts[evt.name] += 1 / replays
    return {
        "kernels": dict(per_kernel),
        "counts": dict(counts),
        "step_us": replay_seconds(g, replays) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument(
        "--kind", choices=["greedy", "general"], default="greedy",
        help="the greedy graph, or the general one as decode.py's sampled-with-penalties row runs it",
    )  # fmt: skip
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/profile_step.py needs a CUDA device")
        return
    from fastpath.runtime import LLM, SamplingParams

    llm = LLM("random:llama-1b", device="cuda", dtype="bfloat16", max_batch_size=max(args.batch), max_seq_len=512,
              graph_batch_sizes=args.batch)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    if args.kind == "general":  # the graph's sampling inputs and penalty table hold these rows' state
        from decode import SAMPLED

        params = SamplingParams(**SAMPLED, max_tokens=8, ignore_eos=True, seed=0)
    for b in sorted(args.batch):
        llm.generate([[1000 + i + j for i in range(32)] for j in range(b)], params)
    payload = {"steps": {}}
    rows, kernel_rows = [], []
    for b in args.batch:
        prof = profile_graph(llm, b, kind=args.kind)
        payload["steps"][b] = prof
        groups = collections.Counter()
        for name, us in prof["kernels"].items():
            groups[group_of(name)] += us
        total = sum(groups.values())
        for grp, us in groups.most_common():
            rows.append([b, grp, f"{us:.0f}", f"{us / total:.0%}"])
        rows.append(
            [
                b,
                "sum of kernels",
                f"{total:.0f}",
                f"replay {prof['step_us']:.0f} µs, {sum(prof['counts'].values()):.0f} kernels",
            ]
        )
        top = sorted(prof["kernels"].items(), key=lambda kv: -kv[1])[:12]
        print(f"batch {b} top kernels:")
        for name, us in top:
            n = prof["counts"][name]
            print(f"  {us:8.1f} us  x{n:.0f}  {name[:110]}")
            kernel_rows.append([b, f"`{name[:70]}`", f"{n:.0f}", f"{us:.1f}", f"{us / n:.2f}"])
    table = markdown_table(["batch", "group", "µs/step", "share"], rows)
    table += "\n\n" + markdown_table(["batch", "kernel", "launches", "µs/step", "µs/launch"], kernel_rows)
    table += (
        "\n\nUnder programmatic dependent launch a kernel's time holds its wait for the kernel before"
        " it; run with FASTPATH_PDL=0 for each kernel's own time. Each linear alone: bench/linear.py."
    )
    write_outputs(
        args.out, "profile_step" if args.kind == "greedy" else "profile_step-general", payload, table
    )


if __name__ == "__main__":
    main()
