"""Tensor-parallel failure scenarios, each run in a subprocess by test_tp_failures.py so that a hang
fails the test at its timeout instead of stalling the suite.

    python tp_scenarios.py <scenario>   -> one JSON line: the error rank 0 got, how each worker ended,
                                           and what was left running
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("FASTPATH_PROGRESS", "0")

import tp_hooks

from fastpath.runtime import LLM, EventLists, RuntimeHooks, SamplingParams
from fastpath.runtime.parallel import launcher

WORKER_SETS: list = []


class RecordedWorkerSet(launcher.WorkerSet):
    """Keeps the worker processes at hand, so the report can say how each one ended."""

    def __init__(self, procs) -> None:
        super().__init__(procs)
        WORKER_SETS.append(self)


launcher.WorkerSet = RecordedWorkerSet

DEVICE = os.environ.get("TP_SCENARIO_DEVICE", "cpu")
MODEL = dict(model="random:tiny-llama", device=DEVICE, max_seq_len=128, max_batch_size=4, tp=2)
LONG = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)


def after_warmup() -> LLM:
    events = EventLists(after_warmup_fns=(tp_hooks.fail_on_rank_1,))
    return LLM(**MODEL, hooks=RuntimeHooks(executor_events=events))


def hung_after_warmup() -> LLM:
    events = EventLists(after_warmup_fns=(tp_hooks.hang_on_rank_1,))
    return LLM(**MODEL, hooks=RuntimeHooks(executor_events=events), tp_timeout_s=3.0)


def killed_worker() -> None:
    llm = LLM(**MODEL)
    try:
        for i, _ in enumerate(llm.stream([[1, 2, 3]], LONG)):
            if i == 2:
                os.kill(llm.parallel.workers.procs[1].pid, signal.SIGKILL)
    finally:
        llm.close()


def stopped_worker() -> None:
    llm = LLM(**MODEL, tp_timeout_s=5.0)
    try:
        for i, _ in enumerate(llm.stream([[1, 2, 3]], LONG)):
            if i == 2:
                os.kill(llm.parallel.workers.procs[1].pid, signal.SIGSTOP)
    finally:
        llm.close()


def worker_raises() -> None:
    llm = LLM(**MODEL, hooks=RuntimeHooks(decode_prologue=tp_hooks.FailingPrologue(at=5)))
    try:
        llm.generate([[1, 2, 3]], LONG)
    finally:
        llm.close()


def worker_fails_to_build() -> LLM:
    return LLM(**MODEL, executor_cls=tp_hooks.FailsToBuildOnRank1)


SCENARIOS = {
    f.__name__: f
    for f in (
        after_warmup,
        hung_after_warmup,
        killed_worker,
        stopped_worker,
        worker_raises,
        worker_fails_to_build,
    )
}


def main() -> None:
    start = time.monotonic()
    report: dict[str, object] = {"error": None}
    try:
        SCENARIOS[sys.argv[1]]()
    except Exception as exc:
        report = {"error": type(exc).__name__, "message": str(exc)}
    report["seconds"] = round(time.monotonic() - start, 1)
    report["children_alive"] = [p.name for p in multiprocessing.active_children()]
    report["worker_exit_codes"] = {r: p.exitcode for ws in WORKER_SETS for r, p in ws.procs.items()}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
