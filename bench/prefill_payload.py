#!/usr/bin/env python3
"""Host time to build one prefill step's payload (engine/steps.py `prefill_step`), beside the
per-token Python loop it replaced, for a serving-sized mixed step: k new prompts of 128 tokens
plus d decoding sequences riding along. No device is involved.

    python bench/prefill_payload.py --out DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, write_outputs

BS = 16


def per_token(batch):
    """The previous builder: a Python loop over every token of the step."""
    ids, positions, slots, tables, logits_rows, offset = [], [], [], [], [], 0
    ends = [s + n for s, n in zip(batch.starts, batch.lens, strict=True)]
    width = max(-(-e // BS) for e in ends)
    for seq, start, n, samples in zip(batch.seqs, batch.starts, batch.lens, batch.samples, strict=True):
        ids.extend(seq.token_at(i) for i in range(start, start + n))
        positions.extend(range(start, start + n))
        slots.extend(seq.block_table[i // BS] * BS + i % BS for i in range(start, start + n))
        table = seq.block_table[:width]
        tables.append(table + [0] * (width - len(table)))
        offset += n
        if samples:
            logits_rows.append(offset - 1)
    return [
        torch.tensor(v, dtype=torch.int64)
        for v in (ids, positions, slots, tables, ends, batch.lens, logits_rows)
    ]


def mixed_batch(prompts: int, decoding: int):
    from fastpath.runtime import SamplingParams
    from fastpath.runtime.engine.scheduler import ScheduledBatch
    from fastpath.runtime.engine.sequence import Sequence

    p = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    seqs, starts, lens = [], [], []
    for i in range(prompts + decoding):
        seq = Sequence(i, [(i * 7 + j) % 500 for j in range(128)], p, 0, frozenset(), 1024)
        seq.block_table = list(range(1 + i * 20, 1 + i * 20 + 13))
        if i >= prompts:
            seq.output_ids = [5] * 60
        seqs.append(seq)
        starts.append(0 if i < prompts else 187)
        lens.append(128 if i < prompts else 1)
    return ScheduledBatch("prefill", seqs, starts, lens, [True] * len(seqs))


def seconds(fn, batch, repeats: int = 300) -> float:
    for _ in range(20):
        fn(batch)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn(batch)
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    from fastpath.runtime.engine.steps import prefill_step

    rows = []
    for prompts, decoding in ((1, 0), (8, 56), (16, 48)):
        batch = mixed_batch(prompts, decoding)
        new = seconds(lambda b: prefill_step(b, BS), batch)
        old = seconds(per_token, batch)
        rows.append({"prompts": prompts, "decoding": decoding, "tokens": sum(batch.lens), "numpy_s": new,
                     "per_token_s": old})  # fmt: skip
    body = [[r["prompts"], r["decoding"], r["tokens"], f"{r['numpy_s'] * 1e6:.0f}", f"{r['per_token_s'] * 1e6:.0f}",
             f"{r['per_token_s'] / r['numpy_s']:.1f}×"] for r in rows]  # fmt: skip
    table = markdown_table(["new prompts", "decoding rows", "tokens", "prefill_step µs", "per-token loop µs",
                            "speed-up"], body)  # fmt: skip
    write_outputs(args.out, "prefill_payload", {"env": environment(), "rows": rows}, table)
    print(table)


if __name__ == "__main__":
    main()
