"""Progress for long work (weight loading, warmup, graph capture): rich on a terminal, quiet otherwise."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def enabled() -> bool:
    return os.environ.get("FASTPATH_PROGRESS", "auto") == "1" or (
        os.environ.get("FASTPATH_PROGRESS", "auto") == "auto" and sys.stderr.isatty()
    )


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    if not enabled():
        yield from items
        return
    from rich.progress import track

    yield from track(items, description=description, total=total, transient=True, console=None)
