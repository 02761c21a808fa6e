#!/usr/bin/env python3
"""What one `add` message to the engine process costs for a large offline batch (CPU only): each
request's objects sealed apart (core_process.sealed), its SamplingParams once per message as
core_client.submit sends them, beside the same batch with the params sealed into every request, and
round 32's message, pickled whole (which the engine's reader unpickles in its one loads).

    python bench/engine_messages.py [--requests 4096]
"""

from __future__ import annotations

import argparse
import pickle
import time

from fastpath.runtime import SamplingParams
from fastpath.runtime.engine.core_process import sealed

REPEATS = 7


def _unsealed(params: SamplingParams, n: int) -> list:
    """Round 32's message: one pickle of everything, so one object the engine cannot rebuild lost all."""
    return [(i, [1, 2, 3] * 20, params, False, [(i, 0, None)], None, None, None) for i in range(n)]


def _per_request(params: SamplingParams, n: int) -> list:
    return [
        (i, [i], sealed(([1, 2, 3] * 20, params, False, [(i, 0, None)], None, None, None))) for i in range(n)
    ]


def _shared(params: SamplingParams, n: int) -> tuple:
    body = [(i, [i], 0, sealed(([1, 2, 3] * 20, False, [(i, 0, None)], None, None, None))) for i in range(n)]
    return [sealed(params)], body


def _unseal_per_request(message: list) -> None:
    for *_, blob in message:
        pickle.loads(blob)


def _unseal_shared(message: tuple) -> None:
    for blob in message[0]:
        pickle.loads(blob)
    _unseal_per_request(message[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4096)
    n = ap.parse_args().requests
    params = SamplingParams(max_tokens=16, temperature=0.7, top_p=0.9, stop=["\n\n"], logprobs=2)
    rows = []
    for name, make, unseal in [("unsealed, one pickle (round 32)", _unsealed, lambda m: None),
                               ("params in every request", _per_request, _unseal_per_request),
                               ("params once a message (the engine's)", _shared, _unseal_shared)]:  # fmt: skip
        seal_s, unseal_s = [], []
        for _ in range(REPEATS):  # the best of several: a busy machine only ever adds time
            t0 = time.perf_counter()
            message = make(params, n)
            t1 = time.perf_counter()
            wire = pickle.dumps(message)
            t2 = time.perf_counter()
            unseal(pickle.loads(wire))
            t3 = time.perf_counter()
            seal_s.append(t1 - t0)
            unseal_s.append(t3 - t2)
        rows.append((name, min(seal_s) * 1e3, len(wire) / 1e6, min(unseal_s) * 1e3))
    print(
        f"| {n} requests, best of {REPEATS} | seal ms (caller) | message MB | unseal ms (engine's reader) |"
    )
    print("|---|---|---|---|")
    for name, seal_ms, mb, unseal_ms in rows:
        print(f"| {name} | {seal_ms:.1f} | {mb:.2f} | {unseal_ms:.1f} |")


if __name__ == "__main__":
    main()
