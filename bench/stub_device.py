"""A device that costs no GPU: each step returns token 7 after a GIL-free sleep, as waiting for a
CUDA step does, so what a bench measures is the host alone. Shared by host_step.py and serve_host.py.

`stub_runner(runner, ...)` patches an engine in this process; `SleepingExecutor` does the same inside
an engine process (`LLM(..., engine_process=True, executor_cls=SleepingExecutor)`), reading its
step times from FASTPATH_STUB_STEP_US and FASTPATH_STUB_PREFILL_US, which the child inherits.
"""

from __future__ import annotations

import os
import time

import torch

from fastpath.runtime.engine.native_executor import NativeExecutor

TOP_K = 20  # top-k logprobs a stub step returns for rows that ask (the sampler's width)


def stub_runner(runner, step_s: float = 0.0, prefill_s: float = 0.0) -> None:
    from fastpath.runtime.runner.sampler import Sampled

    def run(n: int, seconds: float, top: bool) -> Sampled:
        if seconds:
            time.sleep(seconds)  # releases the GIL, as waiting for the device does
        tops = (torch.full((n, TOP_K), 7, dtype=torch.int64), torch.zeros(n, TOP_K)) if top else ()
        return Sampled(torch.full((n,), 7, dtype=torch.int64), torch.zeros(n), *tops)

    runner.run_decode = lambda step, prev: run(step.num_seqs, step_s, step.top_logprobs)
    runner.run_prefill = lambda step, guided=None, prev_tokens=None: run(
        step.logits_rows.numel(), prefill_s, step.top_logprobs
    )


class SleepingExecutor(NativeExecutor):
    def start(self) -> None:
        super().start()
        step = float(os.environ.get("FASTPATH_STUB_STEP_US", "0")) * 1e-6
        prefill = float(os.environ.get("FASTPATH_STUB_PREFILL_US", "0")) * 1e-6
        stub_runner(self.runner, step, prefill)
