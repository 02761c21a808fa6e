"""Python's cyclic collector in the processes fastpath owns: the heap built at startup is frozen.

A full (oldest-generation) collection walks every tracked object. After torch, transformers, FastAPI
and a model are imported, that is 350,000 objects or more, and one walk holds the GIL for 100-350 ms
(measured on two cores: 180-230 ms in an API server process, more in the engine process). CPython
runs one whenever enough objects have outlived the younger generations, which a busy server's
requests and steps do every few seconds. In an API server process it holds back every request
that process is admitting; in the engine process it stops every step. Round 13's H200 runs each had
one such stall of 200-265 ms, in which 10-20 new requests waited for their first token.

None of the startup objects is garbage, so they are collected once and then frozen
(`gc.freeze()`): later collections walk only what was allocated since, which takes well under a
millisecond. vLLM's engine and API server do the same.

An engine in the caller's process (`LLM`) leaves the caller's collector alone: its heap is the
caller's. `FASTPATH_GC_FREEZE=0` turns the freeze off (to measure it against).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import time

log = logging.getLogger("fastpath.engine")

ENV = "FASTPATH_GC_FREEZE"


def freeze_startup_heap(label: str = "") -> int:
    """Collect once, then move every surviving object out of the collector's reach; how many were
    frozen (0 when the environment turned it off)."""
    if os.environ.get(ENV, "1").strip() == "0":
        return 0
    start = time.perf_counter()
    gc.collect()
    gc.freeze()
    # Frozen objects outlive the collection at interpreter exit, and extensions built with nanobind
    # (Triton's) then report each as a leak on stderr: thaw them first. Registered once.
    atexit.unregister(gc.unfreeze)
    atexit.register(gc.unfreeze)
    frozen = gc.get_freeze_count()
    log.debug("%sfroze %d startup objects out of garbage collection in %.0f ms", label, frozen,
              (time.perf_counter() - start) * 1e3)  # fmt: skip
    return frozen
