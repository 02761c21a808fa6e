"""A submitted request as its caller sees it: the handle that streams its outputs and holds its result.

The engine's loop thread only appends small events (a completion has n tokens; it finished; the
request failed) and wakes the handle. Everything costly (detokenizing, stop strings, logprob
dicts) happens on the consumer's side, in the thread or event loop that reads the handle, so the
loop thread stays free for the device. A stop string found here aborts the completion's sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .detokenizer import IncrementalText, token_text
from .outputs import CompletionOutput, EngineClosedError, Logprob, PositionLogprobs, RequestOutput
from .sampling_params import SamplingParams
from .sequence import Sequence


@dataclass(slots=True)
class _Completion:
    seq: Sequence
    text: IncrementalText | None
    seen: int = 0  # output tokens taken in so far
    kept: int | None = None  # tokens kept once a stop string ended it early
    sent_tokens: int = 0  # tokens already handed to a stream
    sent_logprobs: int = 0
    finish_sent: bool = False  # a stream carries each completion's finish once
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.seq.output_ids[: self.kept if self.kept is not None else self.seen]


class RequestHandle:
    """Iterate it for incremental outputs (or `async for` when made with an event loop); `result()`
    waits for the final one; `abort()` stops it. Safe to read from one consumer at a time."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_ids: list[int],
        params: SamplingParams,
        tokenizer: Any,
        abort: Callable[[Sequence], None],
        loop: asyncio.AbstractEventLoop | None = None,
        wake: threading.Event | None = None,
    ) -> None:
        """`wake`: an event shared by handles one consumer waits on together (generate, stream)."""
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.params = params
        self.tokenizer = tokenizer if params.detokenize else None
        self._token_text = token_text(tokenizer) if self.tokenizer is not None else _no_text
        self.loop = loop
        self.prompt_logprobs: list[PositionLogprobs | None] | None = None
        self._abort_seq = abort
        self._completions: list[_Completion] = []
        self._events: deque[tuple] = deque()
        self._wake = wake or threading.Event()
        self._async_wake = asyncio.Event() if loop is not None else None
        self.error: str | None = None
        # The engine refused the request itself (its LoRA adapter could not be read): it failed
        # alone, where another error means the engine failed.
        self.rejected = False
        self.created: float = 0.0  # set by the engine: when it was submitted (time.monotonic)
        self.engine_token: int | None = None  # what an engine process prepared for it (core_client.py)
        # An async stream's deltas carry at least this many tokens (its first and last excepted): a
        # server under load sends fewer, larger events (serve's --stream-interval).
        self.stream_interval = 1

    # --- the engine's side (its loop thread) ------------------------------------------------------

    def attach(self, seq: Sequence) -> None:
        p = self.params
        text = None
        if self.tokenizer is not None:
            text = IncrementalText(
                self.tokenizer,
                self.prompt_ids,
                skip_special_tokens=p.skip_special_tokens,
                stop=p.stop,
                include_stop_str_in_output=p.include_stop_str_in_output,
                min_tokens=p.min_tokens,
            )
        seq.sink = self
        self._completions.append(_Completion(seq, text))

    @property
    def sequences(self) -> list[Sequence]:
        return [c.seq for c in self._completions]

    def first_token_at(self, index: int) -> float | None:
        """time.monotonic() when completion `index` got its first token; None before that."""
        return self._completions[index].seq.first_token_at

    def scheduled_at(self, index: int) -> float | None:
        """time.monotonic() when completion `index` first got a batch slot; None before that."""
        return self._completions[index].seq.scheduled_at

    def post(self, event: tuple) -> None:
        """('tokens', i, n) | ('finish', i, n) | ('error', message) | ('rejected', message): from the
        loop thread."""
        self._events.append(event)

    def wake(self) -> None:
        """After a step's posts; async handles are woken in one batch per event loop (engine/core.py)."""
        # A set event stays set until its consumer clears it before draining, so setting it again
        # changes nothing; an async handle's event is never cleared. Event.set takes a lock and
        # notifies: at 64 streams that was a tenth of the server's CPU.
        if not self._wake.is_set():
            self._wake.set()

    def wake_async(self) -> None:
        if self._async_wake is not None:
            self._async_wake.set()

    def fail(self, message: str, rejected: bool = False) -> None:
        """End the request with `message`: the engine's failure, or (`rejected`) this request's own."""
        self.post(("rejected" if rejected else "error", message))
        self.wake()
        if self.loop is not None:
            wake_on(self.loop, self.wake_async)

    # --- the consumer's side ----------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.error is not None or all(c.finish_reason is not None for c in self._completions)

    def abort(self) -> None:
        """Stop every completion still running; what was generated so far stays."""
        for c in self._completions:
            if c.finish_reason is None:
                self._abort_seq(c.seq)

    def _drain(self) -> bool:
        """Take in posted events; True when anything changed."""
        changed = False
        while self._events:
            event = self._events.popleft()
            changed = True
            if event[0] in ("error", "rejected"):
                self.error = event[1]
                self.rejected = self.rejected or event[0] == "rejected"
                continue
            _, i, n = event
            c = self._completions[i]
            self._take_tokens(
                c, n, text_end=n - 1 if event[0] == "finish" and self._ends_on_stop_token(c) else n
            )
            if event[0] == "finish" and c.finish_reason is None:
                seq = c.seq
                c.finish_reason, c.stop_reason = seq.finish_reason or "abort", seq.stop_reason
                if c.text is not None:
                    c.text.finish()
        return changed

    def _ends_on_stop_token(self, c: _Completion) -> bool:
        """Ended by EOS or a stop_token_ids token: as in vLLM, that token's text is left out of the
        output text (its id stays in token_ids) unless include_stop_str_in_output."""
        seq = c.seq
        return (
            seq.finish_reason == "stop"
            and not isinstance(seq.stop_reason, str)
            and not self.params.include_stop_str_in_output
        )

    def _take_tokens(self, c: _Completion, n: int, text_end: int | None = None) -> None:
        if c.finish_reason is not None or n <= c.seen:
            return  # a stop string ended it: later tokens are the overlap's, and dropped
        new = c.seq.output_ids[c.seen : n if text_end is None else max(c.seen, text_end)]
        c.seen = n
        if c.text is None:
            return
        hit = c.text.add(new)
        if hit is not None:
            c.kept, c.finish_reason, c.stop_reason = n, "stop", hit
            self._abort_seq(c.seq)

    def __iter__(self) -> Iterator[RequestOutput]:
        """Incremental outputs: each holds what is new since the last (text and token ids). Leaving
        the loop early (break, an exception) aborts the request, as vLLM's does."""
        try:
            while True:
                changed = self._drain()
                done = self.finished
                if changed:
                    delta = self._output(delta=True)
                    if delta is not None:
                        yield delta
                if done:
                    return
                self._wake.wait()
                self._wake.clear()
        finally:
            if not self.finished:
                self.abort()

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        """As __iter__, on the event loop given to submit(); a cancelled task aborts the request."""
        if self._async_wake is None:
            raise RuntimeError("this request was submitted without an event loop; iterate it in a thread")
        try:
            while True:
                changed = self._drain()
                done = self.finished
                if changed and (done or self._due()):
                    delta = self._output(delta=True)
                    if delta is not None:
                        yield delta
                if done:
                    return
                await self._async_wake.wait()
                self._async_wake.clear()
        finally:
            if not self.finished:
                self.abort()

    def _due(self) -> bool:
        """Whether a stream's next delta goes out now: its first token always does; later ones once
        `stream_interval` tokens have gathered (or the completion ended)."""
        k = self.stream_interval
        return k <= 1 or any(
            c.sent_tokens == 0 or c.finish_reason is not None or c.seen - c.sent_tokens >= k
            for c in self._completions
        )

    def deltas(self) -> Iterator[RequestOutput]:
        """What arrived since the last call, without waiting: at most one incremental output."""
        if self._drain():
            delta = self._output(delta=True)
            if delta is not None:
                yield delta

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Wait for the request to finish; the whole output."""
        while True:
            self._drain()
            if self.finished:
                return self._output(delta=False)
            if not self._wake.wait(timeout):
                raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
            self._wake.clear()

    def poll(self) -> bool:
        """Take in what arrived without waiting; True once finished."""
        self._drain()
        return self.finished

    # --- outputs ----------------------------------------------------------------------------------

    def _output(self, delta: bool) -> RequestOutput | None:
        outs = [self._completion_output(i, c, delta) for i, c in enumerate(self._completions)]
        if delta and self.error is None and not any(o.token_ids or o.text or o.finish_reason for o in outs):
            return None
        out = RequestOutput(
            self.request_id,
            self.prompt,
            list(self.prompt_ids),
            self.prompt_logprobs,
            outs,
            self.finished,
            self.error,
            self._completions[0].seq.num_cached_tokens if self._completions else 0,
            self._completions[0].seq.lora if self._completions else None,
        )
        if self.error is not None:  # what had not finished ends in the error
            for o, c in zip(outs, self._completions, strict=True):
                if c.finish_reason is None:
                    o.finish_reason = "error"
        return out

    def _completion_output(self, i: int, c: _Completion, delta: bool) -> CompletionOutput:
        ids = c.token_ids
        start = c.sent_tokens if delta else 0
        final = c.finish_reason is not None
        if c.text is None:
            text = ""
        elif delta:
            text = c.text.take(final)
        else:
            text = c.text.text
        logprobs, cumulative = self._logprobs(c, len(ids), delta)
        finish = final and not (delta and c.finish_sent)
        if delta:
            c.sent_tokens = len(ids)
            c.finish_sent = final
        return CompletionOutput(
            i,
            text,
            list(ids[start:]),
            cumulative,
            logprobs,
            c.finish_reason if finish else None,
            c.stop_reason if finish else None,
            c.seq.lora,
        )

    def _logprobs(
        self, c: _Completion, upto: int, delta: bool
    ) -> tuple[list[PositionLogprobs] | None, float | None]:
        k = self.params.logprobs
        if k is None:
            return None, None
        seq, start = c.seq, (c.sent_logprobs if delta else 0)
        upto = min(upto, len(seq.logprobs))
        positions = []
        for j in range(start, upto):
            token = seq.output_ids[j]
            # The sampled token first, then the top-k in rank order, as vLLM orders them: code that
            # reads the first entry as the sampled token's gets it.
            rank = seq.ranks[j] if j < len(seq.ranks) else None
            entry: PositionLogprobs = {token: Logprob(seq.logprobs[j], rank, self._token_text(token))}
            if k and j < len(seq.top_logprobs):
                ids, lps = seq.top_logprobs[j]
                for rank, (t, lp) in enumerate(zip(ids, lps, strict=True), 1):
                    entry[t] = Logprob(lp, rank, self._token_text(t))
            positions.append(entry)
        if delta:
            c.sent_logprobs = upto
        return positions, sum(seq.logprobs[:upto])


def _no_text(token: int) -> None:
    return None


def closed_error(reason: str) -> EngineClosedError:
    return EngineClosedError(f"the engine is closed: {reason}")


def fail_each(handles: Any, message: str, log: Any) -> None:
    """Fail every unfinished handle, each alone: one caller's broken handle must not strand the rest."""
    for handle in handles:
        try:
            if not handle.finished:
                handle.fail(message)
        except Exception:
            log.exception("failing request %s", handle.request_id)


FORKED = "this engine belongs to the process this one was forked from; make a new LLM in this process"


def wake_on(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """`callback(*args)` on `loop`, unless the loop is closed (its owner is gone, or going: it may close
    between the check and the call, which then raises; nobody is left to wake either way)."""
    if not loop.is_closed():
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback, *args)
