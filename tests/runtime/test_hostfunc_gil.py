"""Launching releases the GIL, so a launch never deadlocks against a callback in flight that waits
for the GIL (the TensorRT-LLM bug). The stream is behind and its queue is small, so launches block;
every callback needs the GIL the launching thread holds between launches. Each case runs in a
child process with a bounded timeout, so a deadlock fails the test instead of hanging it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hostdispatch_exts import sim_params

SCRIPT = """
import importlib, json, sys
from fastpath.runtime.dispatch.dispatcher import HostDispatcher
ext = importlib.import_module(sys.argv[1])
sim = importlib.import_module("fastpath.runtime._hostdispatch_sim")
mode, device, hold = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "1"
stream = sim.SimStream(capacity=4)
d = HostDispatcher(mode, extension=ext, device=sim.SimDevice(**device), stream=stream,
                   hold_gil_during_launch=hold)
stream.busy(0.2)
seen = []
for i in range(40):
    d.launch(seen.append, i)
d.synchronize()
assert seen == list(range(40)), seen
print("no deadlock")
"""


def run_case(
    name: str, mode: str, device: dict, hold_gil: bool, timeout: float
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            "-c",
            SCRIPT,
            name,
            mode,
            json.dumps(device),
            "1" if hold_gil else "0",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("case", sim_params(backends=("blocking", "hostfunc_v2", "doorbell")))
def test_a_launch_does_not_deadlock_against_a_callback_waiting_for_the_gil(case):
    name, mode, device, _ = case
    result = run_case(name, mode, device, hold_gil=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no deadlock"


def test_the_same_launch_holding_the_gil_deadlocks():
    # The regression test above can fail: a launch that keeps the GIL hangs on this very scenario.
    name, mode, device, _ = sim_params(backends=("doorbell",))[0].values[0]
    with pytest.raises(subprocess.TimeoutExpired):
        run_case(name, mode, device, hold_gil=True, timeout=4)
