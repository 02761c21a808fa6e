"""Tensor-parallel failures end, with an error that names the rank, instead of hanging.

Each scenario runs in a subprocess (tp_scenarios.py) whose timeout is the bound: a hang fails the
test there rather than stalling the suite.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BOUND_S = 180  # generous for a loaded 2-core CI machine; a hang is what this catches


def run_scenario(name: str, device: str = "cpu") -> dict:
    script = Path(__file__).with_name("tp_scenarios.py")
    env = {**os.environ, "FASTPATH_PROGRESS": "0", "TP_SCENARIO_DEVICE": device}
    try:
        result = subprocess.run(
            [sys.executable, str(script), name], env=env, capture_output=True, text=True, timeout=BOUND_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{name} did not end within {BOUND_S} s: {(exc.stderr or b'')[-2000:]!r}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["children_alive"] == [], f"{name} left worker processes running: {report}"
    return report


def test_after_warmup_failure_on_rank_1_stops_every_rank_naming_rank_and_hook():
    report = run_scenario("after_warmup")
    assert report["error"] == "StartupError"
    assert report["message"] == (
        "start-up failed on rank 1: executor_events.after_warmup hook tp_hooks:fail_on_rank_1 "
        "raised RuntimeError: planted on rank 1"
    )
    assert report["worker_exit_codes"] == {"1": 1}, "rank 1 stopped by itself, with an error, not by a signal"


@pytest.mark.slow
def test_a_rank_that_never_finishes_start_up_is_named_after_the_timeout():
    report = run_scenario("hung_after_warmup")
    assert report["error"] == "StartupError"
    assert report["message"] == "start-up failed on rank 1: did not finish start-up within 3 s"
    assert report["worker_exit_codes"]["1"] < 0, "the hung rank is ended by rank 0"


def test_a_killed_worker_ends_the_run_with_an_error_naming_it():
    report = run_scenario("killed_worker")
    assert report["error"] == "WorkerLost"
    assert report["message"].startswith("tensor-parallel rank 1 (pid ")
    assert report["message"].endswith(") was killed by SIGKILL")


def test_a_stopped_worker_is_named_and_nothing_waits_for_it_forever():
    report = run_scenario("stopped_worker")
    assert report["error"] == "WorkerLost"
    assert report["message"].startswith("tensor-parallel rank 1 (pid ")
    assert report["message"].endswith(") is stopped and does not answer")
    assert report["worker_exit_codes"]["1"] < 0, "rank 0 ends the stopped rank"


def test_a_worker_that_raises_mid_run_is_named_with_its_error():
    report = run_scenario("worker_raises")
    assert report["error"] == "WorkerLost"
    assert "tensor-parallel rank 1 (pid " in report["message"]
    assert report["message"].endswith(
        "exited with code 1 after it raised HookError: decode_prologue hook tp_hooks:FailingPrologue "
        "raised RuntimeError: planted decode failure on rank 1"
    )


@pytest.mark.slow
def test_a_worker_that_fails_to_build_its_shard_is_named_with_its_error():
    report = run_scenario("worker_fails_to_build")
    assert report["error"] == "WorkerLost"
    assert report["message"].endswith(
        "exited with code 1 after it raised RuntimeError: planted build failure on rank 1"
    )
