#!/usr/bin/env python3
"""What LoRA costs a decode step: the same batches on an engine with LoRA off, and on one with
`enable_lora` serving requests with no adapter, with one adapter, and with two (every projection,
rank 16), side by side in one process, alternating, as ratios of the LoRA-off step. On CUDA a third
engine runs the two adapters with the deltas as three torch ops a projection (round 27's path) in
place of the shrink and expand kernels.

The step time is the engine's own count of decode seconds over decode steps (bench/common.py
`counted_run`), so prefill is left out. The adapters are seeded random ones in PEFT's layout
(runtime/model/random_adapter.py).

    python bench/lora.py --out DIR [--model random:llama-1b] [--batch 8 64] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import counted_run, environment, markdown_table, write_outputs

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--model", default="random:llama-1b")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128, help="decode steps a timed batch runs")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a tiny random model on the CPU: the smoke test")
    args = ap.parse_args()
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    from fastpath.runtime import LLM, LoRARequest, SamplingParams
    from fastpath.runtime.model.random_adapter import write_random_adapter

    cuda = torch.cuda.is_available() and not args.quick
    model = "random:tiny-llama" if args.quick else args.model
    if args.quick:
        args.batch, args.tokens, args.repeats = [2, 4], 8, 2
    settings = dict(
        device="cuda" if cuda else "cpu", max_seq_len=args.tokens + 64, max_batch_size=max(args.batch)
    )
    lora = dict(enable_lora=True, max_loras=2, max_lora_rank=args.rank)
    engines = {"off": LLM(model, **settings)}
    if cuda:  # round 27's three torch ops a projection, captured into this engine's graphs
        from fastpath.runtime.kernels import triton_ops

        triton_ops.LORA_KERNELS = False
        engines["torch ops"] = LLM(model, **lora, **settings)
        triton_ops.LORA_KERNELS = True
    engines["on"] = LLM(model, **lora, **settings)
    cfg, vocab = engines["off"].config.model, engines["off"].config.model.vocab_size
    folder = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    adapters = [
        LoRARequest(f"a{i}", i + 1, write_random_adapter(cfg, folder / f"a{i}", i, args.rank, ALL))
        for i in range(2)
    ]
    # (engine, which adapters the batch's rows take in turn)
    cases = {
        "LoRA off": ("off", [None]),
        "LoRA on, no adapter": ("on", [None]),
        "LoRA on, one adapter": ("on", adapters[:1]),
        "LoRA on, two adapters": ("on", adapters),
    }
    if cuda:
        cases["LoRA on, two adapters, torch ops"] = ("torch ops", adapters)
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=0.0)
    step_us: dict[str, dict[int, list[float]]] = {name: {b: [] for b in args.batch} for name in cases}
    for b in args.batch:
        prompts = [[(i * 131 + j) % vocab for j in range(16)] for i in range(b)]
        for repeat in range(args.repeats + 1):  # the first round warms every case
            for name, (engine, loras) in cases.items():
                llm = engines[engine]
                per_row = [loras[i % len(loras)] for i in range(b)]
                run = lambda llm=llm, prompts=prompts, per_row=per_row: llm.generate(  # noqa: E731
                    prompts, params, use_tqdm=False, lora_request=per_row
                )
                _, decode_s, _, steps = counted_run(llm, run)
                if repeat:
                    step_us[name][b].append(decode_s / steps * 1e6)
    rows, payload = [], {"environment": environment(), "model": model, "rank": args.rank, "cases": {}}
    for name in cases:
        medians = {b: statistics.median(step_us[name][b]) for b in args.batch}
        payload["cases"][name] = {"step_us": step_us[name], "median_us": medians}
        rows.append(
            [name]
            + [
                f"{medians[b]:.0f} µs ({medians[b] / statistics.median(step_us['LoRA off'][b]):.3f}×)"
                for b in args.batch
            ]
        )
    table = markdown_table(["case", *(f"batch {b}" for b in args.batch)], rows)
    write_outputs(args.out, "lora-quick" if args.quick else "lora", payload, table)
    for llm in engines.values():
        llm.close()


if __name__ == "__main__":
    main()
