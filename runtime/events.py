"""Reference executor_events hooks."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .engine.executor import ExecutorCore

log = logging.getLogger("fastpath.events")

# glibc mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
_KEEP_BYTES = 1 << 30  # never trim the heap top below this
_MMAP_MAX = 32 << 20  # the largest threshold glibc accepts on 64-bit: big buffers come from the heap


def _glibc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def retain_host_pages(executor: ExecutorCore | None = None) -> bool:
    """after_warmup: keep freed host pages in the process instead of returning them to the OS.

    Per-step host buffers are freed and reallocated every step; with glibc's defaults large ones are
    mmap'd and unmapped each time, and the heap top is trimmed, which costs page faults on the next step.
    Returns whether it took effect (False, with a log line, where there is no glibc).
    """
    libc = _glibc()
    if libc is None:
        log.info("retain_host_pages: no glibc on %s: nothing to do", platform.platform())
        return False
    ok = libc.mallopt(M_TRIM_THRESHOLD, _KEEP_BYTES) == 1 and libc.mallopt(M_MMAP_THRESHOLD, _MMAP_MAX) == 1
    log.info("retain_host_pages: mallopt %s", "applied" if ok else "refused")
    return ok


def health_check(executor: ExecutorCore) -> dict[str, object]:
    """at_shutdown: report leaked KV blocks, stranded requests, kept callback errors and device faults."""
    report: dict[str, object] = {}
    alloc, sched = executor.allocator, executor.scheduler
    report["kv_blocks_leaked"] = (alloc.num_blocks - 1) - alloc.num_free
    report["requests_stranded"] = len(sched.waiting) + len(sched.running)
    report["preemptions"] = sched.num_preemptions
    if executor.is_cuda:
        try:
            torch.cuda.synchronize(executor.device)
            report["device"] = "ok"
        except RuntimeError as exc:
            report["device"] = f"fault: {exc}"
    problems = [k for k in ("kv_blocks_leaked", "requests_stranded") if report[k]]
    if problems or str(report.get("device", "ok")) != "ok":
        log.warning("health_check: %s", report)
    else:
        log.info("health_check: %s", report)
    return report
