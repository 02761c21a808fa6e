"""Rank 0's watch over the worker processes it spawned: each death is noted the moment it happens."""

from __future__ import annotations

import logging
import multiprocessing.connection
import signal
import threading
import time
from typing import Any

from .state import WorkerLost

log = logging.getLogger("fastpath.parallel")


def describe_exit(proc) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"(pid {proc.pid}) was killed by {name}"
    return f"(pid {proc.pid}) exited with code {code}"


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger): Linux's /proc/<pid>/stat state T or t."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class WorkerSet:
    """Rank 0's view of the worker processes it spawned: a thread records each death as it happens."""

    def __init__(self, procs: dict[int, Any]) -> None:
        self.procs = procs
        self._deaths: dict[int, str] = {}
        self._closing = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="fastpath-tp-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        live = dict(self.procs)
        while live and not self._closing:
            ready = multiprocessing.connection.wait([p.sentinel for p in live.values()], timeout=0.5)
            for rank, proc in list(live.items()):
                if proc.sentinel in ready:
                    proc.join(1.0)  # reap it, so that its exit code is known
                    del live[rank]
                    if not self._closing:
                        with self._lock:
                            self._deaths[rank] = describe_exit(proc)
                        log.error("tensor-parallel rank %d %s", rank, self._deaths[rank])

    def deaths(self, grace_s: float) -> dict[int, str]:
        """Ranks seen to die, waiting up to `grace_s` for the first (a peer's error can beat the watcher)."""
        deadline = time.monotonic() + grace_s
        while True:
            with self._lock:
                found = dict(self._deaths)
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.02)

    def unresponsive(self) -> dict[int, str]:
        """Live workers that cannot answer: stopped by a signal, or, failing that, every live one."""
        live = {r: p for r, p in self.procs.items() if p.is_alive()}
        stopped = {
            r: f"(pid {p.pid}) is stopped and does not answer" for r, p in live.items() if _stopped(p.pid)
        }
        return stopped or {r: f"(pid {p.pid}) did not answer a collective in time" for r, p in live.items()}

    def check(self) -> None:
        if self._deaths:
            found = self.deaths(0.0)
            rank = min(found)
            raise WorkerLost(f"tensor-parallel rank {rank} {found[rank]}")

    def await_check_in(self, store: Any, timeout_s: float) -> None:
        """Wait until every worker has started and reached the store, or one of them has died."""
        deadline = time.monotonic() + timeout_s
        keys = [f"checkin/{r}" for r in self.procs]
        while not store.check(keys):
            self.check()
            if time.monotonic() > deadline:
                raise WorkerLost(f"tensor-parallel workers did not start within {timeout_s:g} s")
            time.sleep(0.02)

    def close(self, timeout_s: float) -> None:
        """Wait for the workers to leave; end those that do not."""
        self._closing = True
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
