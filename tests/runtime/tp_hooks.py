"""Hooks planted in tensor-parallel tests. Worker processes unpickle them by name, so they live in a
module of their own on the tests' path."""

from __future__ import annotations

import time

from fastpath.runtime import NativeExecutor
from fastpath.runtime.hooks import ALL_OFF


def _rank(executor) -> int:
    return executor.parallel.rank if executor.parallel is not None else 0


def fail_on_rank_1(executor) -> None:
    if _rank(executor) == 1:
        raise RuntimeError("planted on rank 1")


def hang_on_rank_1(executor) -> None:
    if _rank(executor) == 1:
        time.sleep(3600)


class FailingPrologue:
    """decode_prologue hook that declines (the native prologue runs), and raises on rank 1 at call `at`."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0

    def __call__(self, executor, inputs) -> bool:
        if _rank(executor) == 1:
            self.calls += 1
            if self.calls >= self.at:
                raise RuntimeError("planted decode failure on rank 1")
        return False


class FailsToBuildOnRank1(NativeExecutor):
    """An executor whose construction fails on rank 1 (a stand-in for, say, running out of memory)."""

    def __init__(self, config, hooks=ALL_OFF, parallel=None) -> None:
        if parallel is not None and parallel.rank == 1:
            raise RuntimeError("planted build failure on rank 1")
        super().__init__(config, hooks, parallel=parallel)
