"""bench/gpu_clocks.py: nvidia-smi's samples labelled by the phase they fell in, unreadable ones skipped."""

import io
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_clocks import ClockLog


def test_samples_land_in_the_phase_they_were_read_in_and_unreadable_ones_are_skipped():
    log = ClockLog(proc=types.SimpleNamespace(stdout=io.StringIO("1500, 100.0\n")))
    log._read()  # no phase open: dropped
    assert log.summary("engine") is None
    log.proc.stdout = io.StringIO("1980, 350.5\n[N/A], 300\n1700, 410.0\n1755, 380.0\n")
    with log.phase("engine"):
        log._read()
    assert log.label is None
    assert log.summary("engine") == {"sm_mhz": 1755.0, "power_w": 380.0, "samples": 3}


def test_without_nvidia_smi_the_log_is_empty_and_closes(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    log = ClockLog.start(0)
    with log.phase("x"):
        pass
    assert log.summary("x") is None
    log.close()
