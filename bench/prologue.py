#!/usr/bin/env python3
"""Decode prologue latency, per-hook step time, and retain_host_pages' effect, on a GPU, in one run.

    python bench/prologue.py --out DIR [--quick]

- Prologue: a decode step's input prologue (token ids, positions, slot mapping, block-table rows,
  embedding lookup), native vs FusedDecodePrologue, each captured in a CUDA graph of its own and
  replayed, so the figure is device time from the prologue's start to the first layer's input.
- Step time: the 1.2B Llama's decode step with each hook on alone, all on, and all off.
- retain_host_pages: step time in fresh processes with and without it (mallopt is process-wide),
  mean and 95% confidence interval over several runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, wall, write_outputs

MODEL = "random:llama-1b"
T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36}  # two-sided t, n-1 degrees of freedom


def _llm(hooks=None, batch=8, **kw):
    from fastpath.runtime import LLM

    return LLM(
        MODEL, device="cuda", dtype="bfloat16", max_batch_size=batch, max_seq_len=512, hooks=hooks, **kw
    )


def step_time(llm, batch: int, short=16, long=96, repeats=3) -> float:
    from fastpath.runtime import SamplingParams

    prompts = [[1000 + 13 * i + j for j in range(24)] for i in range(batch)]

    def run(n):
        return wall(
            lambda: llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        )

    run(short)
    return statistics.median((run(long) - run(short)) / (long - short) for _ in range(repeats))


def prologue_latency(batch: int, replays: int = 1000) -> dict[str, float]:
    """µs per prologue, each variant replayed from its own graph."""
    from fastpath.runtime import RuntimeHooks
    from fastpath.runtime.engine.sampling_params import SamplingParams
    from fastpath.runtime.engine.sequence import Sequence
    from fastpath.runtime.engine.steps import stage
    from fastpath.runtime.prologues import FusedDecodePrologue
    from fastpath.runtime.runner.decode_inputs import (
        FIXED_COLUMNS,
        DecodeBuffers,
        DecodeInputs,
        native_prologue,
    )

    fused = FusedDecodePrologue()
    llm = _llm(RuntimeHooks(decode_prologue=fused), batch=batch)
    core = llm.executor
    seqs = []
    for i in range(batch):
        seq = Sequence(i, [1000 + i] * 200, SamplingParams(temperature=0.0), 0, frozenset(), 512)
        seq.block_table = core.allocator.allocate(13)
        seq.num_pending = 1  # its last token is still on the device, as in the overlap loop
        seqs.append(seq)
    width = core.table_width
    packed = torch.zeros(batch, FIXED_COLUMNS + width, dtype=torch.int64, pin_memory=True)
    stage(packed, seqs, {i: i for i in range(batch)}, core.block_size)
    bufs = DecodeBuffers.allocate(batch, width, core.model.cfg.hidden_size, core.dtype, core.device)
    prev = torch.arange(batch, device="cuda")
    inputs = DecodeInputs(batch, packed, bufs, prev)
    variants = {
        "native": lambda: native_prologue(inputs, core.model.embed),
        "fused": lambda: fused(core, inputs),
    }
    out = {}
    for name, fn in variants.items():
        for _ in range(3):
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        out[name] = start.elapsed_time(end) * 1e3 / replays
    llm.close()
    return out


def hook_step_times(batches: list[int], repeats: int) -> list[dict]:
    from fastpath.runtime import EventLists, RuntimeHooks
    from fastpath.runtime.events import retain_host_pages
    from fastpath.runtime.prologues import FusedDecodePrologue

    variants = {
        "all off": RuntimeHooks(),
        "loop_on_execution_stream": RuntimeHooks(loop_on_execution_stream=True),
        "decode_prologue (fused)": RuntimeHooks(decode_prologue=FusedDecodePrologue()),
        "all on": RuntimeHooks(True, FusedDecodePrologue(), EventLists((retain_host_pages,))),
    }
    rows = []
    for name, hooks in variants.items():
        llm = _llm(hooks, batch=max(batches))
        for b in batches:
            rows.append({"hooks": name, "batch": b, "step_s": step_time(llm, b, repeats=repeats)})
            print(rows[-1], flush=True)
        llm.close()
    return rows


def retain_child(retain: bool) -> None:
    """One measurement in a fresh process: batch-1 step time, with or without retain_host_pages."""
    from fastpath.runtime import EventLists, RuntimeHooks
    from fastpath.runtime.events import retain_host_pages

    hooks = RuntimeHooks(executor_events=EventLists((retain_host_pages,))) if retain else RuntimeHooks()
    llm = _llm(hooks, batch=1, graph_batch_sizes=[1])
    print(json.dumps({"step_s": step_time(llm, 1, repeats=3)}))


def retain_runs(runs: int) -> dict[str, dict[str, float]]:
    out: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(runs):
        for label in ("off", "on") if i % 2 == 0 else ("on", "off"):  # alternate: drift hits both
            cmd = [sys.executable, __file__, "--retain-child", label]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[label].append(json.loads(done.stdout.strip().splitlines()[-1])["step_s"])
            print(label, out[label][-1], flush=True)
    summary = {}
    for label, xs in out.items():
        mean = statistics.mean(xs)
        half = T95.get(len(xs), 2.0) * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
        summary[label] = {"mean_s": mean, "ci95_s": half, "runs": xs}
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--retain-child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/prologue.py needs a CUDA device; none is visible")
        return
    if args.retain_child:
        retain_child(args.retain_child == "on")
        return
    payload = {"env": environment(), "prologue_us": {}}
    rows = []
    for b in (1, 8):
        lat = prologue_latency(b)
        payload["prologue_us"][b] = lat
        rows.append([f"prologue, batch {b}", f"native {lat['native']:.1f} µs", f"fused {lat['fused']:.1f} µs",
                     f"{lat['native'] / lat['fused']:.1f}x"])  # fmt: skip
    steps = hook_step_times([1, 8], repeats=1 if args.quick else 3)
    payload["steps"] = steps
    base = {r["batch"]: r["step_s"] for r in steps if r["hooks"] == "all off"}
    for r in steps:
        rows.append([f"step, {r['hooks']}", f"batch {r['batch']}", f"{r['step_s'] * 1e6:.0f} µs",
                     f"{r['step_s'] / base[r['batch']]:.3f}x of all off"])  # fmt: skip
    retain = retain_runs(2 if args.quick else 4)
    payload["retain_host_pages"] = retain
    for label in ("off", "on"):
        s = retain[label]
        rows.append([f"retain_host_pages {label}", "batch 1", f"{s['mean_s'] * 1e6:.1f} ± {s['ci95_s'] * 1e6:.1f} µs",
                     f"{len(s['runs'])} processes"])  # fmt: skip
    write_outputs(args.out, "prologue", payload, markdown_table(["measure", "", "", ""], rows))


if __name__ == "__main__":
    main()
