"""Host buffers handed out two per key, in turn.

The overlap loop keeps one step in flight: when a step is staged or launched, the step before the
one in flight has completed. So a buffer last used two uses ago (per key) is free again, while the
other may still be read by a pending copy. Staging, sampling rows and read-back all use this.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Alternating(Generic[T]):
    def __init__(self, make: Callable[[Hashable], T]) -> None:
        self._make = make
        self._pairs: dict[Hashable, list[T]] = {}

    def next(self, key: Hashable) -> T:
        pair = self._pairs.get(key)
        if pair is None:
            pair = self._pairs[key] = [self._make(key), self._make(key)]
        pair.reverse()
        return pair[0]
