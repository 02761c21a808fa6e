"""A caller waiting for many requests at once (generate, chat), with a progress bar on a terminal."""

from __future__ import annotations

import threading

from ..progress import enabled
from .request import RequestHandle


def wait_all(handles: list[RequestHandle], wake: threading.Event, show: bool) -> None:
    """Until every handle has finished; `wake` is the event they share."""
    bar = _bar(len(handles)) if show and enabled() else None
    pending = list(handles)
    try:
        while pending:
            pending = [h for h in pending if not h.poll()]
            if bar is not None:
                bar.update(bar.task_ids[0], completed=len(handles) - len(pending))
            if pending:
                wake.wait()
                wake.clear()
    finally:
        if bar is not None:
            bar.stop()


def _bar(total: int):
    from rich.progress import Progress

    bar = Progress(transient=True)
    bar.add_task("requests", total=total)
    bar.start()
    return bar
