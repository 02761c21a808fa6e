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


def conversation(engines, batch, vocab: int, k: int = 8, tokens: int = 32) -> dict:
    """Greedy tokens of two turns of k conversations on both engines: how many the cache leaves equal.

    The first turn finds only the system prompt; the next resends the first reply, whose KV the
    caching engine kept from decode steps where the other prefills it. In float32 both counts are
    whole; in bf16 the two KV computations round differently, and this says how far that goes."""
    from fastpath.runtime import SamplingParams

    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0)
    first = batch(k)
    replies = {c: [list(o.outputs[0].token_ids) for o in llm.generate(first, params, use_tqdm=False)]
               for c, llm in engines.items()}  # fmt: skip
    # Both engines continue the uncached engine's conversation, so the prompts of the turn are equal.
    follow = [
        p + r + [(i * 613 + j) % vocab for j in range(16)]
        for i, (p, r) in enumerate(zip(first, replies[False], strict=True))
    ]
    after = {c: [list(o.outputs[0].token_ids) for o in llm.generate(follow, params, use_tqdm=False)]
             for c, llm in engines.items()}  # fmt: skip

    def equal(out):  # tokens before each conversation's first difference: after it, nothing compares
        return sum(next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
                   for x, y in zip(out[False], out[True], strict=True))  # fmt: skip

    return {"tokens": k * tokens, "first_turn_equal": equal(replies), "next_turn_equal": equal(after)}


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
    settings = dict(device="cuda" if cuda else "cpu", max_seq_len=args.system + args.question + 96,
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
    agreement = conversation(engines, batch, vocab)
    print(agreement, flush=True)
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
        f"caching engine found {stats.prefix_cache_hits} of {stats.prefix_cache_queries} prompt tokens.\n\n"
        f"Greedy tokens before the first difference between cache on and off: {agreement['first_turn_equal']} of "
        f"{agreement['tokens']} on a first turn (the system prompt cached), "
        f"{agreement['next_turn_equal']} of {agreement['tokens']} on the next turn (the reply resent)."
    )
    payload = {"env": environment(), "setup": vars(args) | {"out": str(args.out)}, "rows": rows,
               "hits": stats.prefix_cache_hits, "queries": stats.prefix_cache_queries,
               "agreement": agreement}  # fmt: skip
    write_outputs(
        args.out, "prefix-cache-quick" if args.quick else "prefix-cache", payload, f"{table}\n\n{setup}"
    )
    print(table)


if __name__ == "__main__":
    main()
