"""The engine loop's phases, timed by wrappers (bench/host_phases.py, bench/phase_probe/)."""

from __future__ import annotations

import collections
import time

PHASES = [  # (module, owner, attribute): the loop's parts, outermost first
    ("executor", "ExecutorCore", "launch_decode"),
    ("executor", None, "stage"),
    ("executor", None, "stage_steady"),
    ("executor", None, "decode_step"),
    ("runner", "ModelRunner", "run_decode"),
    ("executor", "ExecutorCore", "_read_back"),
    ("executor", "ExecutorCore", "complete"),
    ("readback", "Readback", "wait"),
    ("scheduler", "Scheduler", "continue_decode"),
    ("core", "EngineCore", "_deliver"),
    ("core_process", "PublishingCore", "_deliver"),
    ("core", "EngineCore", "_take_work"),
    ("scheduler", "Scheduler", "admit_beside"),
    ("scheduler", "Scheduler", "schedule"),
    ("executor", "ExecutorCore", "launch_prefill"),
]


def label(module: str, owner: str | None, name: str) -> str:
    return f"{owner or module}.{name}"


def instrument(spent: dict[str, float], calls: collections.Counter) -> None:
    import importlib

    for module, owner, name in PHASES:
        pkg = "runner" if module == "runner" else "engine"
        mod = importlib.import_module(f"fastpath.runtime.{pkg}.{module}")
        target = getattr(mod, owner) if owner else mod
        real, tag = getattr(target, name), label(module, owner, name)

        def timed(*args, _real=real, _name=tag, **kwargs):
            start = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                spent[_name] += time.perf_counter() - start
                calls[_name] += 1

        setattr(target, name, timed)
