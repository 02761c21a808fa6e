"""A device that costs no GPU, so what a bench measures is the host alone. Each step returns token 7.
Shared by host_step.py, serve_cpu.py and serve_host.py.

`stub_runner(runner, ...)` patches an engine in this process: with no clock a step sleeps in the
launch, without the GIL, as waiting for a CUDA step does. `SleepingExecutor` patches the engine
inside an engine process (`LLM(..., engine_process=True, executor_cls=SleepingExecutor)`) with a
`DeviceClock`: steps run one after another on a timeline of their own while the host goes on, as
on a GPU, and reading a step back waits for its end. Its times come from the environment, which
the child inherits: FASTPATH_STUB_STEP_US per step, and for a prefill step FASTPATH_STUB_PREFILL_US
more plus FASTPATH_STUB_TOKEN_US per token, padded as a prefill graph pads them.
"""

from __future__ import annotations

import os
import time

import torch

from fastpath.runtime.engine.native_executor import NativeExecutor
from fastpath.runtime.runner.prefill_graphs import token_buckets

TOP_K = 20  # top-k logprobs a stub step returns for rows that ask (the sampler's width)


class DeviceClock:
    """One stream: a step starts when it is launched or when the step before it ends, whichever is
    later. `readback` is the executor's; waiting for a step's tokens waits for the step's end."""

    def __init__(self, readback) -> None:
        self.free_at = 0.0
        self._ends: dict[int, float] = {}
        mark, wait = readback.mark, readback.wait

        def timed_mark():
            ticket, event = mark()
            self._ends[ticket] = self.free_at
            return ticket, event

        def timed_wait(ticket, event):
            left = self._ends.pop(ticket, 0.0) - time.perf_counter()
            if left > 0:
                time.sleep(left)
            wait(ticket, event)

        readback.mark, readback.wait = timed_mark, timed_wait

    def run(self, seconds: float) -> None:
        self.free_at = max(time.perf_counter(), self.free_at) + seconds


def stub_runner(
    runner,
    step_s: float = 0.0,
    prefill_s: float = 0.0,
    token_s: float = 0.0,
    clock: DeviceClock | None = None,
) -> None:
    from fastpath.runtime.runner.sampler import Sampled

    buckets = token_buckets(runner.config.max_num_batched_tokens)

    def run(n: int, seconds: float, top: bool) -> Sampled:
        if clock is not None:
            clock.run(seconds)
        elif seconds:
            time.sleep(seconds)  # releases the GIL, as waiting for the device does
        tops = (torch.full((n, TOP_K), 7, dtype=torch.int64), torch.zeros(n, TOP_K)) if top else ()
        return Sampled(torch.full((n,), 7, dtype=torch.int64), torch.zeros(n), *tops)

    def prefill_seconds(tokens: int) -> float:
        padded = next((t for t in buckets if t >= tokens), tokens)
        return step_s + prefill_s + token_s * padded

    runner.run_decode = lambda step, prev: run(step.num_seqs, step_s, step.top_logprobs)
    runner.run_prefill = lambda step, guided=None, prev_tokens=None: run(
        step.logits_rows.numel(), prefill_seconds(step.ids.numel()), step.top_logprobs
    )


def stub_seconds() -> tuple[float, float, float]:
    """(step, prefill extra, per token) seconds from the environment."""
    return tuple(
        float(os.environ.get(f"FASTPATH_STUB_{name}_US", "0")) * 1e-6 for name in ("STEP", "PREFILL", "TOKEN")
    )


class SleepingExecutor(NativeExecutor):
    def start(self) -> None:
        super().start()
        stub_runner(self.runner, *stub_seconds(), clock=DeviceClock(self.readback))
