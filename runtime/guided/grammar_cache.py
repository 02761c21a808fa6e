"""Compiled grammars, one per distinct constraint, kept in a bounded LRU."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .spec import GrammarError, GuidedSpec

__all__ = ["GrammarCache", "GrammarError"]


class GrammarCache:
    """`backend.compile(spec)` once per constraint; each request's matcher from the cached grammar.

    Requests may be admitted from several threads: the lock guards the LRU, not the compile, so a
    long compile holds up no other request (two racing on one new constraint may both compile it).
    """

    def __init__(self, backend: Any, capacity: int = 64) -> None:
        self.backend = backend
        self._capacity = capacity
        self._grammars: OrderedDict[tuple[Any, ...], Any] = OrderedDict()  # GuidedSpec.key
        self._lock = threading.Lock()
        self.compilations = 0

    def __len__(self) -> int:
        return len(self._grammars)

    def get(self, spec: GuidedSpec) -> Any:
        with self._lock:
            grammar = self._grammars.get(spec.key)
            if grammar is not None:
                self._grammars.move_to_end(spec.key)
                return grammar
        grammar = self.backend.compile(spec)
        with self._lock:
            self.compilations += 1
            self._grammars[spec.key] = grammar
            if len(self._grammars) > self._capacity:
                self._grammars.popitem(last=False)
        return grammar

    def matcher(self, spec: GuidedSpec) -> Any:
        return self.backend.matcher(self.get(spec))
