#!/usr/bin/env python3
"""What a prefill step costs the host and the device: `generate` of k prompts with max_tokens=1,
timed on the wall and by the GPU kernels it ran (torch profiler), for k = 1, 4, 16, side by side:
fastpath's paged kernel (triton_prefill, one launch per layer) with the step replayed from a CUDA
graph (the default) and run eagerly, and SDPA (a gather and a kernel per sequence and layer).

A serving engine prefills as requests arrive, a few at a time, between decode steps: a step
whose wall time is far above its kernels' time is set by the host. `prefill-profile.txt` lists
the host's busiest operations in the largest step.

    python bench/prefill.py --out DIR [--model random:llama-1b] [--prompt-len 128] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, write_outputs


def kernel_time(fn) -> tuple[float, int]:
    """Seconds of GPU kernels `fn` ran, and how many."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [
        e for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    ]  # fmt: skip
    return sum(e.device_time_total for e in kernels) / 1e6, len(kernels)


def host_profile(fn) -> str:
    """The operations with the most host time in `fn`, as the profiler tabulates them."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)


SDPA_ORDER = ["triton_decode", "flashinfer", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"]
ENGINES = {  # label -> LLM options
    "triton_prefill, graphs": {},  # the defaults: prefill steps replay CUDA graphs
    "triton_prefill, eager": {"prefill_graphs": False},
    "sdpa per sequence": {"fmha_enabled": SDPA_ORDER},  # not capturable: eager
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--model", default="random:llama-1b")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--prompts", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a tiny random model on the CPU: the smoke test")
    args = ap.parse_args()
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    from fastpath.runtime import LLM, SamplingParams

    cuda = torch.cuda.is_available() and not args.quick
    model = "random:tiny-llama" if args.quick else args.model
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    rows, profiles = [], []
    for attention, options in ENGINES.items() if cuda else [("sdpa per sequence", {})]:
        llm = LLM(
            model, device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else None, max_seq_len=1024,
            **options,
        )  # fmt: skip
        vocab = llm.config.model.vocab_size
        for k in args.prompts:
            prompts = [
                [(i * 7919 + j * 31 + 1) % vocab for j in range(args.prompt_len)]
                for i in range(k * (args.repeats + 3))
            ]
            batches = [prompts[i * k : (i + 1) * k] for i in range(args.repeats + 3)]
            llm.generate(batches[0], one, use_tqdm=False)  # warm: shapes and kernels seen once
            walls = []
            for batch in batches[1 : args.repeats + 1]:
                t0 = time.perf_counter()
                llm.generate(batch, one, use_tqdm=False)
                walls.append(time.perf_counter() - t0)
            gpu, launches = (0.0, 0)
            if cuda:
                gpu, launches = kernel_time(
                    lambda b=batches[-2], llm=llm: llm.generate(b, one, use_tqdm=False)
                )
                if k == max(args.prompts):
                    text = host_profile(lambda b=batches[-1], llm=llm: llm.generate(b, one, use_tqdm=False))
                    profiles.append(f"## {attention}, {k} prompts\n\n{text}")
            row = {"attention": attention, "prompts": k, "tokens": k * args.prompt_len,
                   "wall_s": statistics.median(walls), "gpu_s": gpu, "kernels": launches}  # fmt: skip
            rows.append(row)
            print(row, flush=True)
        llm.close()
    body = [
        [r["attention"], r["prompts"], r["tokens"], f"{r['wall_s'] * 1e3:.2f}", f"{r['gpu_s'] * 1e3:.2f}" if cuda else "-",
         f"{r['wall_s'] / r['gpu_s']:.2f}" if r["gpu_s"] else "-", r["kernels"] or "-"]
        for r in rows
    ]  # fmt: skip
    table = markdown_table(
        ["prefill attention", "prompts", "tokens", "wall ms", "GPU kernels ms", "wall / GPU", "kernels"], body
    )
    setup = f"model {model}, prompts of {args.prompt_len} tokens, max_tokens=1, median of {args.repeats}."
    payload = {"env": environment(), "setup": vars(args) | {"out": str(args.out)}, "rows": rows}
    write_outputs(args.out, "prefill-quick" if args.quick else "prefill", payload, f"{table}\n\n{setup}")
    if profiles:
        (args.out / "prefill-profile.txt").write_text("\n\n".join(profiles) + "\n")
    print(table)


if __name__ == "__main__":
    main()
