#!/usr/bin/env python3
"""Per-step decode latency with and without guided decoding, per host-dispatch mode, in one run.

    python bench/guided.py --out DIR [--tokenizer DIR] [--quick]

The model is the random 1.2B Llama; the tokenizer a byte-level BPE trained here on a synthetic
corpus (32k tokens unless --tokenizer gives one), so xgrammar computes real masks. Guided requests
follow an endless JSON-lines regex, so they run as long as free ones do (ignore_eos, max_tokens).
The grammar work runs in a host callback captured in the decode graph; its wake-up latency is
what the dispatch mode changes.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, wall, write_outputs

MODEL = "random:llama-1b"
ENDLESS_JSON = r'(\{"id": [0-9]{1,4}, "name": "[a-z]{1,8}", "ok": (true|false)\}\n)+'


def tokenizer_dir(path: Path | None, out: Path) -> Path:
    if path is not None:
        return path
    from fastpath.runtime.tiny_checkpoint import synthetic_corpus, train_tokenizer

    target = out / "bench-tokenizer-32k"
    if not (target / "tokenizer.json").is_file():
        train_tokenizer(32000, synthetic_corpus(40000)).save_pretrained(target)
    return target


def step_time(llm, batch: int, guided: bool, short: int, long: int, repeats: int) -> float:
    from fastpath.runtime import SamplingParams

    prompts = [[1000 + 7 * i + j for j in range(16)] for i in range(batch)]

    def params(n):
        spec = {"regex": ENDLESS_JSON} if guided else None
        return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, guided=spec)

    def run(n):
        return wall(lambda: llm.generate(prompts, params(n)))

    run(short)
    return statistics.median((run(long) - run(short)) / (long - short) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--modes", nargs="+", default=["blocking", "spin"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/guided.py needs a CUDA device; none is visible")
        return
    from fastpath.runtime import LLM

    tok = tokenizer_dir(args.tokenizer, args.out)
    short, long, repeats = (8, 40, 1) if args.quick else (16, 112, 3)
    rows, payload = [], {"env": environment(), "rows": []}
    for mode in args.modes:
        llm = LLM(MODEL, device="cuda", dtype="bfloat16", max_batch_size=max(args.batch), max_seq_len=256,
                  tokenizer=tok, guided_backend="xgrammar", dispatch_mode=mode)  # fmt: skip
        backend = llm.executor.dispatcher.backend
        for b in args.batch:
            free = step_time(llm, b, False, short, long, repeats)
            guided = step_time(llm, b, True, short, long, repeats)
            r = {"mode": mode, "backend": backend, "batch": b, "free_s": free, "guided_s": guided}
            payload["rows"].append(r)
            rows.append(
                [mode, backend, b, f"{free * 1e6:.0f}", f"{guided * 1e6:.0f}", f"{guided / free - 1:+.1%}"]
            )
            print(rows[-1], flush=True)
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    table = markdown_table(["mode", "backend", "batch", "free µs/step", "guided µs/step", "overhead"], rows)
    write_outputs(args.out, "guided", payload, table)


if __name__ == "__main__":
    main()
