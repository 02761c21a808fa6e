"""EngineCore: one executor, driven by one loop thread, fed by any number of callers.

Callers on any thread (or an asyncio loop) submit sequences and abort them; the loop thread alone
touches the scheduler and the device. New sequences join the running batch between steps, so every
caller's requests share one continuous batch. When a step fails, the engine is closed with the
reason, every waiting caller gets it, and later calls say the engine was closed and why.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from .executor import ExecutorCore, StepRecord
from .request import FORKED, RequestHandle, closed_error, fail_each, wake_on
from .sequence import Sequence, Status

log = logging.getLogger("fastpath.engine")

JOIN_S = 30.0  # how long close() waits for the loop thread to finish its step


@dataclass(slots=True)
class EngineStats:
    """A snapshot for metrics: requests, tokens and the KV cache."""

    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    # Steps by phase ("prefill", "decode"): how many, the tokens they computed, and the seconds from
    # the previous step's delivery to theirs (while the engine runs without a pause).
    steps: dict[str, int] = field(default_factory=dict)
    step_tokens: dict[str, int] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)
    # Of step_seconds, the time the loop waited for the device's tokens; the rest is host work. A
    # device that is never waited for is one the host keeps waiting instead.
    step_wait_seconds: dict[str, float] = field(default_factory=dict)
    # Prefix caching: prompt tokens looked up at admission, and those found cached (0 when it is off).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


class EngineCore:
    def __init__(
        self, executor: ExecutorCore, errors: Callable[[], contextlib.AbstractContextManager]
    ) -> None:
        """`errors()`: a context that turns a failure another rank caused into the error that names it."""
        self.executor = executor
        self._errors = errors
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._incoming: deque[Sequence] = deque()
        self._aborts: deque[Sequence] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._closed: str | None = None
        self.failure: BaseException | None = None  # what closed the engine, when a step failed
        self._stopping = False
        self._live: set[RequestHandle] = set()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        # phase -> (steps, tokens, seconds, seconds waiting for the device); both phases exist from
        # the start, so stats() on another thread never iterates a dict that grows
        self._steps: dict[str, tuple[int, int, float, float]] = {
            "prefill": (0, 0, 0.0, 0.0),
            "decode": (0, 0, 0.0, 0.0),
        }
        self._last_delivery = 0.0
        self._thread = threading.Thread(target=self._run, name="fastpath-engine", daemon=True)
        self._thread.start()

    # --- any thread -------------------------------------------------------------------------------

    @property
    def closed_reason(self) -> str | None:
        return self._closed

    def submit(self, handles: list[RequestHandle]) -> None:
        """Admit requests together: a generate() call's batch starts as one, not one by one."""
        with self._lock:
            if self._closed is not None:
                raise closed_error(self._closed)
            now = time.monotonic()
            for handle in handles:
                handle.created = now
                self._live.add(handle)
                self._incoming.extend(handle.sequences)
            self._work.notify()

    def abort(self, seq: Sequence) -> None:
        with self._lock:
            self._aborts.append(seq)
            self._work.notify()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the loop thread between steps (it may use the device and the allocator); its result."""
        if threading.current_thread() is self._thread:
            return fn()
        future: Future = Future()
        with self._lock:
            if self._closed is not None:
                raise closed_error(self._closed)
            self._calls.append((fn, future))
            self._work.notify()
        return future.result()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, between steps; False when the engine caches no prefixes."""
        if self._closed is not None:
            raise closed_error(self._closed)
        cache = self.executor.scheduler.prefix_cache
        if cache is None:
            return False
        self.call(cache.reset)
        return True

    def stats(self) -> EngineStats:
        if self._closed is not None:  # as the engine process's client does: no stale figures
            raise closed_error(self._closed)
        ex = self.executor
        sched, alloc = ex.scheduler, ex.allocator
        cache = sched.prefix_cache
        return EngineStats(
            len(sched.running),
            len(sched.waiting) + len(self._incoming),
            alloc.num_blocks - 1,
            alloc.num_free,
            self.prompt_tokens + ex.pooled_tokens,
            self.generation_tokens,
            sched.num_preemptions,
            *_columns(list(self._steps.items())),
            prefix_cache_queries=cache.queried_tokens if cache is not None else 0,
            prefix_cache_hits=cache.hit_tokens if cache is not None else 0,
        )

    def forked(self) -> None:
        """In a forked child: closed, with fresh locks (a parent's thread may have held them at the fork)."""
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._closed, self._stopping = FORKED, True
        self._live, self._calls = set(), deque()
        self._incoming.clear()

    def close(self, reason: str = "close() was called") -> bool:
        """Stop the loop thread after its current step; True when it stopped within JOIN_S."""
        if self._closed == FORKED:
            return True
        with self._lock:
            if self._closed is None:
                self._closed = reason
            self._stopping = True
            self._work.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(JOIN_S)
        return not self._thread.is_alive()

    # --- the loop thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self._last_delivery = time.monotonic()
                guided = self.executor.guided  # looked up once, not each step
                with self._errors(), contextlib.closing(self.executor.steps()) as steps:
                    for record in steps:
                        self._deliver(record)
                        if guided is not None and guided.broken:
                            self._end_broken_grammars(guided)
                        if not self._take_work():
                            break
        except BaseException as exc:
            self._fail(exc)
        else:
            self._fail_pending(closed_error(self._closed or "closed"))

    def _wait_for_work(self) -> bool:
        with self._lock:
            while not (self._incoming or self._aborts or self._calls or self._stopping):
                self._work.wait()
        return self._take_work()

    def _take_work(self) -> bool:
        """Admit, abort and run calls; False when the engine is stopping."""
        with self._lock:
            if self._stopping:
                return False
            incoming, self._incoming = self._incoming, deque()
            aborts, self._aborts = self._aborts, deque()
            calls, self._calls = self._calls, deque()
        sched = self.executor.scheduler
        for seq in incoming:
            self.prompt_tokens += len(seq.prompt_ids)
            problem = sched.add(seq)
            if problem is not None:
                self._reject(seq, problem)
        for seq in aborts:
            if not seq.finished:
                sched.abort(seq)
                self._report_finish(seq)
        for fn, future in calls:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as exc:
                    future.set_exception(exc)
        return True

    def _deliver(self, record: StepRecord) -> None:
        touched: set[RequestHandle] = set()
        now = self._count(record)
        for seq, _ in record.new_tokens:
            if seq.first_token_at is None:  # for time-to-first-token, streamed or not
                seq.first_token_at = now
            if seq.streams and seq.sink is not None and not seq.finished:
                seq.sink.post(("tokens", seq.index, len(seq.output_ids)))
                touched.add(seq.sink)
        ending: set[RequestHandle] = set()
        for seq in record.finished:
            if seq.sink is not None:
                seq.sink.post(("finish", seq.index, len(seq.output_ids)))
                touched.add(seq.sink)
                ending.add(seq.sink)
        self._wake(touched)
        for handle in ending:  # only a handle one of whose sequences just finished can be done
            if all(s.finished for s in handle.sequences):
                self._live.discard(handle)

    def _count(self, record: StepRecord) -> float:
        """Tally a completed step; the time now."""
        self.generation_tokens += len(record.new_tokens)
        now = time.monotonic()
        steps, tokens, seconds, waited = self._steps.get(record.phase, (0, 0, 0.0, 0.0))
        # One new tuple per step: a reader on another thread sees the old tally or the new, never half.
        self._steps[record.phase] = (
            steps + 1,
            tokens + record.num_tokens,
            seconds + now - self._last_delivery,
            waited + record.device_wait_s,
        )
        self._last_delivery = now
        return now

    def _end_broken_grammars(self, guided: Any) -> None:
        """A request whose grammar refused the token it sampled ends with that error, rather than run
        on unconstrained: its other bans left no token the grammar allows."""
        for seq in guided.take_broken():
            if seq.finished:
                continue
            self.executor.scheduler.abort(seq)
            self._reject(
                seq,
                f"guided decoding: {seq.guided.error}; the request's allowed_token_ids, bad_words or "
                "logit_bias ban every token its grammar allows there",
            )

    def _reject(self, seq: Sequence, message: str) -> None:
        """A sequence the scheduler would not take (its adapter could not be read): it fails alone."""
        seq.status, seq.finish_reason, seq.error = Status.FINISHED, "abort", message
        if seq.sink is not None:
            seq.sink.post(("rejected", message))
        self._report_finish(seq)

    def _report_finish(self, seq: Sequence) -> None:
        if seq.sink is not None:
            seq.sink.post(("finish", seq.index, len(seq.output_ids)))
            self._wake({seq.sink})
            if all(s.finished for s in seq.sink.sequences):  # an abort ends the handle here
                self._live.discard(seq.sink)

    @staticmethod
    def _wake(handles: set[RequestHandle]) -> None:
        by_loop: dict[Any, list[RequestHandle]] = {}
        for h in handles:
            h.wake()
            if h.loop is not None:
                by_loop.setdefault(h.loop, []).append(h)
        for loop, group in by_loop.items():  # one cross-thread call per event loop per step
            wake_on(loop, _wake_all, group)

    def _fail(self, exc: BaseException) -> None:
        reason = f"a step failed with {type(exc).__name__}: {exc}"
        log.error("engine closed: %s", reason, exc_info=exc)
        self.failure = exc
        with self._lock:
            if self._closed is None:
                self._closed = reason
            self._stopping = True
        self._fail_pending(closed_error(reason))

    def _fail_pending(self, error: Exception) -> None:
        with self._lock:
            live, self._live = self._live, set()
            calls, self._calls = self._calls, deque()
            self._incoming.clear()
        fail_each(live, str(error), log)
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)


def _columns(
    rows: list[tuple[str, tuple]],
) -> tuple[dict[str, int], dict[str, int], dict[str, float], dict[str, float]]:
    """Steps, tokens, seconds and seconds waiting for the device by phase, from one snapshot of each
    phase's tally."""
    return (
        {phase: int(v[0]) for phase, v in rows},
        {phase: int(v[1]) for phase, v in rows},
        {phase: float(v[2]) for phase, v in rows},
        {phase: float(v[3]) for phase, v in rows},
    )


def _wake_all(handles: list[RequestHandle]) -> None:
    for h in handles:
        h.wake_async()
