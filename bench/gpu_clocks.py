"""The GPU's SM clock and power draw while a bench runs, sampled by `nvidia-smi -lms` and labelled by
phase: whether a step run inside the engine loop and its graph replayed alone ran at the same clock.

    clocks = ClockLog.start(device_index=0)    # a no-op where nvidia-smi is missing
    with clocks.phase("b256 engine"):
        ...
    clocks.summary("b256 engine")              # {"sm_mhz": ..., "power_w": ..., "samples": ...}
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import threading
from dataclasses import dataclass, field

PERIOD_MS = 50


@dataclass(slots=True)
class ClockLog:
    proc: subprocess.Popen | None = None
    label: str | None = None
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, device_index: int = 0) -> ClockLog:
        log = cls()
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return log
        cmd = [exe, "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", f"-lms={PERIOD_MS}"]
        uuid = _uuid(device_index)
        if uuid:
            cmd.append(f"--id={uuid}")
        try:
            log.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return log
        log.reader = threading.Thread(target=log._read, name="gpu-clocks", daemon=True)
        log.reader.start()
        return log

    def _read(self) -> None:
        for line in self.proc.stdout:
            label = self.label
            if label is None:
                continue
            try:
                mhz, watts = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue  # "[N/A]" on a GPU that does not report one of them
            self.samples.setdefault(label, []).append((mhz, watts))

    @contextlib.contextmanager
    def phase(self, label: str):
        self.label = label
        try:
            yield
        finally:
            self.label = None

    def summary(self, label: str) -> dict | None:
        got = self.samples.get(label)
        if not got:
            return None
        return {
            "sm_mhz": statistics.median(m for m, _ in got),
            "power_w": statistics.median(w for _, w in got),
            "samples": len(got),
        }

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)


def _uuid(device_index: int) -> str | None:
    """The GPU's UUID as nvidia-smi names it (CUDA_VISIBLE_DEVICES renumbers indices, not UUIDs)."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
    except Exception:
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
