#!/usr/bin/env python3
"""A/B of how a decode step's read-back completes, on the 1.2B Llama, in one process.

A C++ host callback marking a flag, posted on the step's stream (the default where the dispatcher
posts) or waited for on a side stream, against a CUDA event the host synchronizes on.

    python bench/ab_decode.py --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import markdown_table, write_outputs
from decode import MODEL, engine_step_time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/ab_decode.py needs a CUDA device")
        return
    from fastpath.runtime import LLM
    from fastpath.runtime.engine.readback import Readback

    rows, payload = [], []
    variants = {
        "posted callback": (True, True),
        "callback on a side stream": (True, False),
        "event": (False, False),
    }
    for name, (callback, posting) in variants.items():
        Readback.by_callback, Readback.posting = callback, posting
        llm = LLM(MODEL, device="cuda", dtype="bfloat16", max_batch_size=max(args.batch), max_seq_len=512)
        if posting and not llm.executor.dispatcher.posts:
            print(f"skipping {name!r}: {llm.executor.dispatcher.info()['ring_reason']}")
            llm.close()
            continue
        for b in args.batch:
            step = engine_step_time(llm, b, 16, 144, 3)[0]
            payload.append({"readback": name, "batch": b, "step_s": step})
            rows.append([name, b, f"{step * 1e6:.0f}"])
            print(rows[-1], flush=True)
        llm.close()
    Readback.by_callback, Readback.posting = True, True
    write_outputs(
        args.out, "ab_decode", {"rows": payload}, markdown_table(["readback", "batch", "µs/step"], rows)
    )


if __name__ == "__main__":
    main()
