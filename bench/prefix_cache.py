#!/usr/bin/env python3
"""What prefix caching saves: batches of k requests that share a long system prompt and differ in a
short question, generating one token (time to first token), on the same engine settings with
`enable_prefix_caching` off and on, side by side, alternating, as a ratio.

The first batch warms both engines (and fills the cache of the caching one); each timed batch has
questions never seen before, so only the shared system prompt can be found.

    python bench/prefix_cache.py --out DIR [--model random:llama-1b] [--system 1024] [--question 64] [--quick]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--model", default="random:llama-1b")
    ap.add_argument("--system", type=int, default=1024, help="tokens of the shared system prompt")
    ap.add_argument("--question", type=int, default=64, help="tokens of each request's own question")
    ap.add_argument("--prompts", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a tiny random model on the CPU: the smoke test")
    args = ap.parse_args()
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    from fastpath.runtime import LLM, SamplingParams

    cuda = torch.cuda.is_available() and not args.quick
    model = "random:tiny-llama" if args.quick else args.model
    if args.quick:
        args.system, args.question, args.prompts, args.repeats = 96, 8, [1, 4], 3
    settings = dict(device="cuda" if cuda else "cpu", max_seq_len=args.system + args.question + 16,
                    max_batch_size=max(args.prompts), max_num_batched_tokens=8192)  # fmt: skip
    engines = {cached: LLM(model, enable_prefix_caching=cached, **settings) for cached in (False, True)}
    vocab = engines[False].config.model.vocab_size
    system = [(j * 31 + 7) % vocab for j in range(args.system)]
    asked = iter(range(1 << 30))

    def batch(k: int) -> list[list[int]]:
        return [system + [(next(asked) * 7919 + j) % vocab for j in range(args.question)] for _ in range(k)]

    one = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    rows = []
    for k in args.prompts:
        walls: dict[bool, list[float]] = {False: [], True: []}
        for llm in engines.values():
            llm.generate(batch(k), one, use_tqdm=False)  # warm: shapes seen, the system prompt cached
        for _ in range(args.repeats):
            for cached, llm in engines.items():  # alternating, so drift hits both
                prompts = batch(k)
                t0 = time.perf_counter()
                llm.generate(prompts, one, use_tqdm=False)
                walls[cached].append(time.perf_counter() - t0)
        off, on = statistics.median(walls[False]), statistics.median(walls[True])
        row = {"prompts": k, "off_s": off, "on_s": on, "speedup": off / on,
               "off_spread_s": max(walls[False]) - min(walls[False]),
               "on_spread_s": max(walls[True]) - min(walls[True])}  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    stats = engines[True].stats()
    for llm in engines.values():
        llm.close()
    body = [
        [r["prompts"], f"{r['off_s'] * 1e3:.2f}", f"{r['on_s'] * 1e3:.2f}", f"{r['speedup']:.2f}x"]
        for r in rows
    ]
    table = markdown_table(["requests", "cache off, ms", "cache on, ms", "off / on"], body)
    setup = (
        f"model {model} on {'CUDA' if cuda else 'the CPU'}, a {args.system}-token system prompt and "
        f"{args.question}-token questions, max_tokens=1, median of {args.repeats} alternating runs; the "
        f"caching engine found {stats.prefix_cache_hits} of {stats.prefix_cache_queries} prompt tokens."
    )
    payload = {"env": environment(), "setup": vars(args) | {"out": str(args.out)}, "rows": rows,
               "hits": stats.prefix_cache_hits, "queries": stats.prefix_cache_queries}  # fmt: skip
    write_outputs(
        args.out, "prefix-cache-quick" if args.quick else "prefix-cache", payload, f"{table}\n\n{setup}"
    )
    print(table)


if __name__ == "__main__":
    main()
