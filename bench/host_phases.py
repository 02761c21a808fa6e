#!/usr/bin/env python3
"""Where a decode step's host time goes, phase by phase, on the real device: µs per step of each
part of the engine's loop, timed by wrappers around them (a profiler's overhead would swamp them).

    python bench/host_phases.py --out DIR [--batch 64 256] [--sampling greedy penalties] [--tokens 200]

bench/host_step.py takes the device out and measures the loop's Python; this keeps the device, so
launches, copies and the read-back wait count too. A phase's time includes the phases it calls
(launch_decode holds stage or stage_steady, decode_step and run_decode). "host" is the loop's step
less its wait for the device, as bench/decode.py reports it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, write_outputs
from decode import phase_workload
from phases import PHASES, instrument, label


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--model", default="random:llama-1b")
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--sampling", nargs="+", choices=["greedy", "penalties"], default=["greedy", "penalties"])
    args = ap.parse_args()
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    instrument(spent, calls)
    from fastpath.runtime import LLM

    cuda = torch.cuda.is_available()
    rows = []
    for batch in args.batch:
        llm = LLM(args.model, device="cuda" if cuda else "cpu", max_batch_size=batch, max_seq_len=512)
        for kind in args.sampling:
            prompts, params = phase_workload(llm, batch, kind, args.tokens)
            llm.generate(prompts, params, use_tqdm=False)  # warm
            spent.clear()
            calls.clear()
            before = llm.stats()
            llm.generate(prompts, params, use_tqdm=False)
            after = llm.stats()
            steps = after.steps["decode"] - before.steps["decode"]
            seconds = after.step_seconds["decode"] - before.step_seconds["decode"]
            waited = after.step_wait_seconds["decode"] - before.step_wait_seconds["decode"]
            row = {"sampling": kind, "batch": batch, "steps": steps, "step_us": seconds / steps * 1e6,
                   "host_us": (seconds - waited) / steps * 1e6}  # fmt: skip
            names = [label(*phase) for phase in PHASES]
            row |= {f"{name}_us": spent[name] / steps * 1e6 for name in names}
            row |= {f"{name}_calls": calls[name] for name in names}
            rows.append(row)
            print(
                json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
        llm.close()
    names = [label(*phase) for phase in PHASES]
    headers = ["sampling", "batch", "µs/step", "host µs", *names]
    body = [
        [r["sampling"], r["batch"], f"{r['step_us']:.0f}", f"{r['host_us']:.0f}",
         *(f"{r[f'{name}_us']:.0f} ({r[f'{name}_calls']})" for name in names)]
        for r in rows
    ]  # fmt: skip
    text = markdown_table(headers, body) + (
        f"\n\nµs per decode step in each phase (calls in the run); {args.tokens} tokens a row, model {args.model}.\n"
    )
    write_outputs(args.out, "host_phases", {"env": environment(), "setup": vars(args) | {"out": str(args.out)},
                                            "rows": rows}, text)  # fmt: skip
    print(text)


if __name__ == "__main__":
    main()
