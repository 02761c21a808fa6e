"""xgrammar's matcher calls for the Python fill, made with the GIL held from start to end.

xgrammar's tvm-ffi bindings release the GIL on every call. In a host callback that makes several
calls per step, each return must win the GIL back from the engine's Python thread, and a busy
thread gives it up only every switch interval (5 ms): measured on the CPU, a 16-row fill went from
70 µs to 12 ms with one busy Python thread beside it. Holding the GIL makes the callback take it
once per step; the fill itself still runs on xgrammar's own threads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 quota where there is one.

    xgrammar's "auto" thread count reads the host's core count, which in a container can be many
    times what the process may use; a pool that large only adds wake-ups.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cpus


def _held(type_cls: Any, name: str) -> Any:
    """A wrapper of our own around an ffi method, with release_gil off (the flag is per wrapper)."""
    import tvm_ffi

    method = next(m for m in type_cls.__tvm_ffi_type_info__.methods if m.name == name)
    own = tvm_ffi.Array([method.func])[0]
    if own is method.func:
        raise TypeError("tvm-ffi returned the shared wrapper")
    own.release_gil = False
    return own


class MatcherCalls:
    """accept / terminated / fill over many matchers; GIL-holding where the binding allows it."""

    def __init__(self, threads: int | str = 1) -> None:
        """threads: 1 fills row by row on the calling thread; more (or "auto") use xgrammar's pool.

        Row by row is the default because it measured faster: 16 rows took 252 µs that way and
        660 µs through an 8-thread pool on the H200's host (bench/guided.py, its "Host" line).
        """
        import xgrammar as xgr

        # "auto": one thread is the callback's own; leave one more for the engine's thread.
        self.threads = max(1, min(8, usable_cpus() - 2)) if threads == "auto" else int(threads)
        self._batch = xgr.BatchGrammarMatcher(self.threads)
        try:
            from xgrammar.tvm_ffi_binding import BatchGrammarMatcher, GrammarMatcher

            self._accept = _held(GrammarMatcher, "accept_token")
            self._fill = _held(BatchGrammarMatcher, "batch_fill_next_token_bitmask")
            self._fill_one = _held(GrammarMatcher, "fill_next_token_bitmask")
            self._terminated = _held(GrammarMatcher, "is_terminated")
            self.holds_gil = True
        except (ImportError, AttributeError, StopIteration, TypeError):
            self.holds_gil = False  # another binding: its public calls, whatever they do with the GIL

    def accept(self, matcher: Any, token: int) -> bool:
        return (
            bool(self._accept(matcher._handle, token, False))
            if self.holds_gil
            else matcher.accept_token(token)
        )

    def terminated(self, matcher: Any, token: int) -> bool:
        """Whether `matcher` ended with `token`, its last accepted one (xgrammar knows without it)."""
        return bool(self._terminated(matcher._handle)) if self.holds_gil else matcher.is_terminated()

    def fill(self, matchers: list[Any], bitmask: Any, rows: list[int]) -> None:
        """Across xgrammar's pool, or row by row on this thread when there is one row or one thread."""
        if len(matchers) == 1 or self.threads == 1:
            for m, r in zip(matchers, rows, strict=True):
                if self.holds_gil:
                    self._fill_one(m._handle, bitmask, r, False)
                else:
                    m.fill_next_token_bitmask(bitmask, r)
        elif not self.holds_gil:
            self._batch.batch_fill_next_token_bitmask(matchers, bitmask, indices=rows)
        else:
            self._fill(self._batch._handle, [m._handle for m in matchers], bitmask, rows, False)
