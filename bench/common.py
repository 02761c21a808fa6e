"""Shared helpers for the benchmarks: device ceilings, timing, and writing tables, JSON and plots."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def _median_seconds(fn: Callable[[], object], device: str, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(gib: float = 2.0, repeats: int = 10, device: str = "cuda") -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    n = int(gib * (1 << 30)) // 2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), device, repeats)
    return 2 * n * 2 / seconds


def matmul_peak(n: int = 8192, repeats: int = 10, device: str = "cuda") -> float:
    """bf16 matrix-product rate in FLOP/s on random n x n operands: the compute ceiling of a step."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    seconds = _median_seconds(lambda: a @ b, device, repeats)
    return 2 * n**3 / seconds


def replay_seconds(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Seconds per replay of a captured graph, back to back on the current stream (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / replays


def wall(fn: Callable[[], object]) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def counted_run(llm, fn: Callable[[], object]) -> tuple[float, float, float, int]:
    """`fn()` (a generation on `llm`) timed: (wall seconds, the engine's counted decode seconds, of
    them waiting for the device, decode steps)."""
    before = llm.stats()
    seconds = wall(fn)
    after = llm.stats()
    return (
        seconds,
        after.step_seconds["decode"] - before.step_seconds["decode"],
        after.step_wait_seconds["decode"] - before.step_wait_seconds["decode"],
        after.steps["decode"] - before.steps["decode"],
    )


def environment() -> dict[str, str]:
    env = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.cuda.is_available():
        env |= {"gpu": torch.cuda.get_device_name(), "cuda": str(torch.version.cuda)}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    return env


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_outputs(out: Path, name: str, payload: dict, table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    (out / f"{name}.md").write_text(table + "\n")
    print(table)
