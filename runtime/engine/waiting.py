"""A caller waiting for many requests at once (generate, chat), with vLLM's progress bar."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ..progress import ENV
from .request import RequestHandle

UseTqdm = bool | Callable[..., Any]


def wait_all(handles: list[RequestHandle], wake: threading.Event, use_tqdm: UseTqdm) -> None:
    """Until every handle has finished; `wake` is the event they share. `use_tqdm` as in vLLM: True
    shows a tqdm bar on stderr, a callable is the tqdm class (or factory) to use, False shows none."""
    bar = _bar(use_tqdm, len(handles))
    pending = list(handles)
    try:
        while pending:
            still = [h for h in pending if not h.poll()]
            if bar is not None and len(still) < len(pending):
                bar.update(len(pending) - len(still))
            pending = still
            if pending:
                wake.wait()
                wake.clear()
    finally:
        if bar is not None:
            bar.close()


def _bar(use_tqdm: UseTqdm, total: int) -> Any:
    return progress_bar(use_tqdm, total, "Processed prompts")


def progress_bar(use_tqdm: UseTqdm, total: int, description: str) -> Any:
    """A tqdm bar of `total` steps as vLLM shows one, or None (use_tqdm False, or FASTPATH_PROGRESS=0)."""
    if not use_tqdm or os.environ.get(ENV) == "0":
        return None
    if callable(use_tqdm):
        factory = use_tqdm
    else:
        from tqdm.auto import tqdm as factory
    # vLLM's keywords, so a functools.partial(tqdm, ...) or a tqdm subclass made for vLLM works here.
    return factory(total=total, desc=description, dynamic_ncols=True)
