"""One HTTP request's engine requests: submitted together, streamed or collected, aborted together.

Submission (tokenizing, rendering a chat template, compiling a grammar) runs in a worker thread so
the event loop keeps streaming other requests meanwhile. Whatever ends the HTTP request (its last
token, its client leaving, the server shutting down) passes through `close()`, which aborts what is
still running, so its KV blocks are freed at the engine's next step.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ..engine.outputs import EngineClosedError, RequestOutput
from ..engine.request import RequestHandle
from ..engine.sampling_params import SamplingParams
from .errors import RequestInvalid, ServeError, Unavailable
from .params import RequestKeys

if TYPE_CHECKING:
    from .state import ServerState


_CLIENT_ID = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII: it goes back out in a header


def client_request_id(header: str | None) -> str | None:
    """The client's X-Request-Id, where it is one this server can send back in a header."""
    return header if header is not None and _CLIENT_ID.fullmatch(header) else None


def request_id(prefix: str, client_id: str | None = None) -> str:
    """The response body's id: `prefix-` and the client's id (`client_request_id`'s, as vLLM names
    it), else a fresh one, unique across API server processes too. The X-Request-Id header goes back
    as the client sent it (middleware.py)."""
    return f"{prefix}-{client_id if client_id is not None else uuid.uuid4().hex}"


class Generation:
    def __init__(
        self, state: ServerState, handles: list[RequestHandle], arrival: float, completions: int, stream: bool
    ):
        self.state = state
        self.stream = stream
        self.handles = handles
        # A streamed request's events gather --stream-interval tokens; a whole response needs only
        # its first token (for the metrics) and its end, not a delta per step.
        for h in handles:
            h.stream_interval = state.config.stream_interval if stream else 1 << 30
        self.arrival = arrival
        self.completions = completions
        self._last: dict[int, float] = {}
        self._reasons: list[str] = []  # finish reasons as they arrive, for metrics
        self._sizes: list[tuple[int, int]] = []  # (prompt, generated) tokens of each finished completion
        self._generated: dict[tuple[int, int], int] = {}  # (prompt, completion) -> tokens so far
        # For the access log: arrival to the first batch slot and to the first token, in ms.
        self.timeline: dict[str, float] = {}
        self._closed = False

    @classmethod
    async def start(
        cls,
        state: ServerState,
        prompts: Callable[[], list[Any]],
        prompt_count: int,
        params: SamplingParams,
        rid: str,
        stream: bool,
        keys: RequestKeys,
        lora: Any = None,
    ) -> Generation:
        """Admit the request (503 at capacity) and submit its prompts; `prompts()` runs in a worker
        thread. `lora`: the LoRARequest its model names (None: the base model)."""
        arrival = time.monotonic()
        completions = params.n * prompt_count
        handles = await admit_and_submit(state, completions, prompts, params, rid, stream, keys, lora)
        return cls(state, handles, arrival, completions, stream)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(h.prompt_ids) for h in self.handles)

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, incremental output) as steps complete; records TTFT and inter-token latency."""
        async for i, out in merged(self.handles):
            if out.error is not None:
                raise failure(self.handles[i], out.error)
            self._tally(i, out)
            if self.stream:
                self._observe(i, out)
            else:
                self._observe_whole(i, out)
            yield i, out

    def _tally(self, i: int, out: RequestOutput) -> None:
        """Each completion's tokens so far (deltas carry those since the last), and for each that
        finished its reason and size, for the metrics."""
        prompt_tokens = len(self.handles[i].prompt_ids)
        for c in out.outputs:
            key = (i, c.index)
            self._generated[key] = self._generated.get(key, 0) + len(c.token_ids)
            if c.finish_reason is not None:
                self._reasons.append(c.finish_reason)
                self._sizes.append((prompt_tokens, self._generated[key]))

    def _observe(self, i: int, out: RequestOutput) -> None:
        tokens = max((len(c.token_ids) for c in out.outputs), default=0)
        if not tokens:
            return
        now = time.monotonic()
        last = self._last.get(i)
        metrics = self.state.metrics
        if last is None:  # a prompt's first token, whichever of its completions had it
            metrics.ttft.observe(now - self.arrival)
            self.timeline.setdefault("ttft_ms", round((now - self.arrival) * 1e3, 3))
            self._observe_queue(i)
        else:
            per_token = (now - last) / tokens
            for _ in range(tokens):
                metrics.itl.observe(per_token)
        self._last[i] = now

    def _observe_whole(self, i: int, out: RequestOutput) -> None:
        """A reply sent whole still had a first token: the engine noted when; the rest is spread evenly."""
        now, metrics, handle = time.monotonic(), self.state.metrics, self.handles[i]
        for c in out.outputs:
            tokens = self._generated[(i, c.index)]
            first = handle.first_token_at(c.index) if c.finish_reason is not None else None
            if first is not None and tokens > 1:
                per_token = (now - first) / (tokens - 1)
                for _ in range(tokens - 1):
                    metrics.itl.observe(per_token)
        if out.finished:  # once per prompt, as a stream counts it
            firsts = [t for c in out.outputs if (t := handle.first_token_at(c.index)) is not None]
            if firsts:
                ttft = max(0.0, min(firsts) - self.arrival)
                metrics.ttft.observe(ttft)
                self.timeline.setdefault("ttft_ms", round(ttft * 1e3, 3))
            self._observe_queue(i)

    def _observe_queue(self, i: int) -> None:
        """Arrival to a prompt's first batch slot in the engine: the wait that is not the model's."""
        handle = self.handles[i]
        slots = [t for j in range(handle.params.n) if (t := handle.scheduled_at(j)) is not None]
        if slots:
            queued = max(0.0, min(slots) - self.arrival)
            self.state.metrics.queue.observe(queued)
            self.timeline.setdefault("queue_ms", round(queued * 1e3, 3))

    async def collect(self) -> list[RequestOutput]:
        """Every prompt's whole output, once all have finished."""
        async for _ in self.outputs():
            pass
        return [h.result() for h in self.handles]

    def abort(self) -> None:
        for h in self.handles:
            h.abort()

    def close(self) -> None:
        """Abort what still runs, record the request, give back its place at the gate. Idempotent."""
        if self._closed:
            return
        self._closed = True
        unfinished = [h for h in self.handles if not h.poll()]
        for h in unfinished:
            h.abort()
        metrics = self.state.metrics
        if unfinished:
            metrics.aborted.inc()
        for reason in self._reasons:
            metrics.finished.labels(reason).inc()
        for prompt_tokens, generated in self._sizes:
            metrics.prompt_tokens.observe(prompt_tokens)
            metrics.generation_tokens.observe(generated)
        metrics.e2e.observe(time.monotonic() - self.arrival)
        self.state.gate.leave(self.completions)


def failure(handle: RequestHandle, error: str) -> ServeError:
    """A request the engine refused alone (its adapter could not be read) is the client's 400; any
    other failure is the engine's, 503."""
    if handle.rejected:
        return RequestInvalid(error, "model")
    return Unavailable(f"the request failed: {error}")


async def admit_and_submit(
    state, completions: int, prompts, params, rid, stream, keys: RequestKeys, lora: Any = None
) -> list[RequestHandle]:
    """Take `completions` places at the gate (503 at capacity or while draining), then submit the
    prompts (`submit_in_thread`); the places go back if the submission fails."""
    try:
        state.gate.enter(completions)
    except Unavailable:
        state.metrics.rejected.labels("draining" if state.gate.draining else "capacity").inc()
        raise
    try:
        return await submit_in_thread(state, prompts, params, rid, stream, keys, lora)
    except BaseException:
        state.gate.leave(completions)
        raise


async def submit_in_thread(
    state, prompts, params, rid, stream, keys: RequestKeys, lora: Any = None
) -> list[RequestHandle]:
    loop = asyncio.get_running_loop()
    adapter = {"lora_request": lora} if lora is not None else {}

    # A client may send the same X-Request-Id twice: the engine's ids stay unique.
    unique = uuid.uuid4().hex[:8]

    def submit_all() -> list[RequestHandle]:
        handles: list[RequestHandle] = []
        try:
            for i, prompt in enumerate(prompts()):
                engine_id = f"{rid}-{unique}-{i}"
                handles.append(
                    state.llm.submit(
                        prompt, params, request_id=engine_id, loop=loop, stream=stream, **adapter
                    )
                )
        except BaseException:
            for h in handles:
                h.abort()
            raise
        return handles

    future = loop.run_in_executor(None, submit_all)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # The client left while its prompts were submitted: abort them once they are in.
        future.add_done_callback(lambda f: f.cancelled() or f.exception() or [h.abort() for h in f.result()])
        raise
    except (EngineClosedError, TimeoutError) as exc:  # TimeoutError: an engine process that did not answer
        raise Unavailable(str(exc)) from None
    except ServeError:
        raise
    except (ValueError, TypeError) as exc:
        message = str(exc)
        raise RequestInvalid(message, keys.blame(message)) from None


async def merged(handles: list[RequestHandle]) -> AsyncIterator[tuple[int, RequestOutput]]:
    if len(handles) == 1:
        async for out in handles[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, handle: RequestHandle) -> None:
        try:
            async for out in handle:
                queue.put_nowait((i, out))
        except BaseException as exc:  # handed to the consumer, which raises it
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
