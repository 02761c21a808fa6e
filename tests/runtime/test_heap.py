"""The startup heap frozen out of the cyclic collector in the processes fastpath owns (engine/heap.py).

Each case runs in a fresh interpreter: freezing pytest's own heap would keep every later test's
cyclic garbage alive."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json
import torch  # a heap the size of a server's
from fastpath.runtime.engine.heap import freeze_startup_heap
frozen = freeze_startup_heap()
gc.collect()
# What a full collection walks: the objects in the collector's generations (frozen ones are not).
print(json.dumps({"frozen": frozen, "freeze_count": gc.get_freeze_count(), "walked": len(gc.get_objects())}))
"""


def _probe(env_value: str | None) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "FASTPATH_GC_FREEZE"}
    if env_value is not None:
        env["FASTPATH_GC_FREEZE"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_startup_heap_is_frozen_and_a_full_collection_then_walks_little():
    frozen = _probe(None)
    assert frozen["frozen"] == frozen["freeze_count"] > 100_000  # torch's objects, among others
    unfrozen = _probe("0")
    assert unfrozen["frozen"] == unfrozen["freeze_count"] == 0
    # The same collection over the same heap, with and without the startup objects in its walk: counted,
    # not timed, so a loaded machine cannot fail it.
    assert frozen["walked"] * 20 < unfrozen["walked"]


def test_the_engine_process_freezes_its_heap():
    from fastpath.runtime import LLM

    with LLM("random:tiny-llama", device="cpu", max_seq_len=128, engine_process=True) as llm:
        assert llm.core.info["gc_frozen"] > 100_000
