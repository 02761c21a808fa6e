"""NativeExecutor: the step loop with every hook read at run time. The baseline generated executors match.

A generated Executor (templates/executor.py.j2) overrides these same methods with the manifest's
hooks compiled in, and leaves out every branch of a hook the manifest does not declare.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from ..hooks import call_prologue, fire
from ..runner.decode_inputs import DecodeInputs
from .executor import ExecutorCore, StepRecord

log = logging.getLogger("fastpath.executor")


class NativeExecutor(ExecutorCore):
    def starts_from_embeddings(self) -> bool:
        return self.hooks.decode_prologue is not None

    def loop_gate(self) -> tuple[bool, str]:
        """Whether loop_on_execution_stream is armed, and why."""
        if not self.hooks.loop_on_execution_stream:
            return False, "hook off"
        if self.runner.execution_stream is None:
            return False, "no CUDA stream on this device: the scope is a no-op"
        if self.config.guided_backend != "none":
            return False, "guided decoding runs its grammar work on a side stream"
        return True, "armed"

    def start(self) -> None:
        with self.warmup_guard():
            self.warmup()
            events = self.hooks.executor_events
            if events is not None:
                fire(events, "after_warmup", self)
        armed, reason = self.loop_gate()
        if self.hooks.loop_on_execution_stream and not armed:
            log.info("loop_on_execution_stream gated off: %s", reason)

    def decode_prologue(self, inputs: DecodeInputs) -> None:
        prologue = self.hooks.decode_prologue
        if prologue is not None and call_prologue(prologue, self, inputs):
            return
        self.native_decode_prologue(inputs)

    def steps(self) -> Iterator[StepRecord]:
        """Run until the scheduler is empty, yielding each completed step."""
        events = self.hooks.executor_events
        if events is not None and not self._loop_started:
            fire(events, "before_overlap_loop", self)
        self._loop_started = True
        armed, _ = self.loop_gate()
        try:
            if armed:
                with self.execution_stream_scope():
                    yield from self.overlap_loop()
            else:
                yield from self.overlap_loop()
        except Exception:
            self.shutdown_after_error()  # at_shutdown runs after a loop error too
            raise

    def shutdown(self) -> None:
        if self.closed:
            return
        events = self.hooks.executor_events
        try:
            if events is not None:
                fire(events, "at_shutdown", self)
        finally:
            super().shutdown()
