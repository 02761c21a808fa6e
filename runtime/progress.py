"""Progress for long work (weight loading, warmup, graph capture): rich on a terminal, quiet otherwise.

FASTPATH_PROGRESS=1 shows these bars off a terminal too; FASTPATH_PROGRESS=0 hides them, and the bar
generate() and chat() show for use_tqdm (engine/waiting.py), which is otherwise always on stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
ENV = "FASTPATH_PROGRESS"


def enabled() -> bool:
    return os.environ.get(ENV, "auto") == "1" or (
        os.environ.get(ENV, "auto") == "auto" and sys.stderr.isatty()
    )


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    if not enabled():
        yield from items
        return
    from rich.progress import track

    yield from track(items, description=description, total=total, transient=True, console=None)
