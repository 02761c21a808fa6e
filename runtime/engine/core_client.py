"""The parent's side of the engine process: EngineCore's interface, with the loop in another process.

With `LLM(..., engine_process=True)` the scheduler and the device run in a spawned process
(engine/core_process.py). This object stands where EngineCore stands: `submit`, `abort`, `stats`,
`close`. Requests keep their RequestHandles here, with sequences that mirror the engine's; a reader
thread applies each step's message to them and wakes their consumers, so consumers cost the parent's
GIL and never the engine's. A request that needs the engine before it can join (a grammar to
compile, prompt logprobs) is prepared by a round trip first, so its errors are raised to its caller.

When the engine process ends (a failed step, a crash, a kill), every running request fails with the
reason and later calls raise EngineClosedError naming it.

The parent's client may open further links into the same engine (`open_link`) for clients in other
processes (the API servers of `fastpath serve --api-server-count N`). Such a client is `owner=False`:
closing it detaches it, ending its own requests, and leaves the engine running.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import multiprocessing as mp
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from .core import EngineCore, EngineStats
from .core_process import PipeSender, Recipe, engine_process_main, sealed
from .request import FORKED, RequestHandle, closed_error, fail_each
from .sequence import Sequence, Status

log = logging.getLogger("fastpath.engine")

JOIN_S = 30.0  # how long close() waits for the engine process to stop its step and exit
RPC_S = 60.0  # bounds a round trip (stats, prepare): the engine answers between steps


class EngineProcessError(RuntimeError):
    """The engine process could not start, or ended."""


class EngineCoreClient:
    def __init__(self, conn: Any, process: Any, info: dict[str, Any], *, owner: bool = True) -> None:
        """`process`: the engine process, which an owner starts and stops (None for a link's client)."""
        self._conn, self.process, self.info, self.owner = conn, process, info, owner
        self._lock = threading.Lock()
        self._seqs: dict[int, Sequence] = {}
        self._live: set[RequestHandle] = set()
        self._replies: dict[int, Future] = {}
        self._tokens = itertools.count(1)
        self._closed: str | None = None
        self.failure: BaseException | None = None
        self.prompt_tokens = 0
        self.generation_tokens = 0
        # A caller (the server's event loop aborting a request) never waits on the pipe.
        self._sender = PipeSender(conn)
        self._reader = threading.Thread(target=self._read, name="fastpath-engine-reader", daemon=True)
        self._reader.start()
        _open_clients.add(self)

    @property
    def closed_reason(self) -> str | None:
        return self._closed

    # --- requests ---------------------------------------------------------------------------------

    def prepare(self, prompt_ids: list[int], params: Any, lora: Any = None) -> tuple[int, Any]:
        """Compile the request's constraint and take its prompt logprobs (under `lora`) in the engine:
        (token to pass with its sequences, prompt logprobs). Raises what the engine raised
        (ValueError: invalid)."""
        token = next(self._tokens)
        return token, self._rpc("prepare", token, sealed((prompt_ids, params, lora)))

    def forget(self, tokens: list[int]) -> None:
        """Prepared requests that will not be submitted."""
        if tokens and self._closed is None:
            self._sender.put(("forget", tokens))

    def submit(self, handles: list[RequestHandle]) -> None:
        # A batch's requests mostly share one SamplingParams: sealed once a message, and unsealed
        # once there, each request naming it by its index.
        items, unsent, params, index = [], [], [], {}
        for h in handles:
            seqs = h.sequences
            members = [(s.seq_id, s.index, s.seed) for s in seqs]
            # The biases as the client resolved them: the engine need not tokenize bad words again.
            body = (h.prompt_ids, seqs[0].streams, members, seqs[0].biases, seqs[0].lora, seqs[0].cache_salt)
            try:
                if id(h.params) not in index:
                    params.append(sealed(h.params))
                    index[id(h.params)] = len(params) - 1
                items.append((h.engine_token, [s.seq_id for s in seqs], index[id(h.params)], sealed(body)))
            except ValueError as exc:  # this request alone (its LoRARequest, say, a class of __main__)
                unsent.append((h, str(exc)))
        if unsent:
            self.forget([h.engine_token for h, _ in unsent if h.engine_token is not None])
            for h, message in unsent:
                h.fail(message, rejected=True)
            handles = [h for h in handles if all(h is not u for u, _ in unsent)]
        now = time.monotonic()
        with self._lock:
            if self._closed is not None:
                raise closed_error(self._closed)
            for h in handles:
                h.created = now
                self._live.add(h)
                self._seqs.update((s.seq_id, s) for s in h.sequences)
                self.prompt_tokens += len(h.prompt_ids) * len(h.sequences)
        self._send(("add", params, items))

    def abort(self, seq: Sequence) -> None:
        """Never raises and never blocks: an engine that is gone has ended the sequence already."""
        if not seq.finished and self._closed is None:
            self._sender.put(("abort", [seq.seq_id]))

    def call(self, fn: Any) -> Any:
        raise RuntimeError("the engine runs in its own process (engine_process=True): nothing runs beside it")

    def stats(self) -> EngineStats:
        return self._rpc("stats", next(self._tokens))

    def pool(self, prompts: list[list[int]], pooling_type: str, per_token: bool, loras: list) -> list:
        """The executor's pool() in the engine process, between its steps."""
        return self._rpc("pool", next(self._tokens), prompts, pooling_type, per_token, loras)

    def reset_prefix_cache(self) -> bool:
        return self._rpc("reset_prefix_cache", next(self._tokens))

    def open_link(self) -> Any:
        """A new pipe into the engine, for a client in another process (`EngineCoreClient(conn, None,
        info, owner=False)` there). The caller passes it on and then closes its own copy."""
        if not self.owner:
            raise RuntimeError("only the client that started the engine process opens links")
        mine, theirs = mp.get_context("spawn").Pipe()
        sent = threading.Event()
        try:
            self._rpc("link", next(self._tokens), theirs, sent=sent)
        except BaseException:
            mine.close()
            raise
        finally:
            # Pickling it (on the sender's thread) hands the engine a copy; close ours only after that.
            if sent.wait(RPC_S):
                theirs.close()
        return mine

    # --- the pipe ---------------------------------------------------------------------------------

    def _send(self, message: tuple, sent: threading.Event | None = None) -> None:
        if self._closed is not None:
            if sent is not None:
                sent.set()  # it never will be sent
            raise closed_error(self._closed)
        self._sender.put(message, sent)

    def _rpc(self, kind: str, token: int, *body: Any, sent: threading.Event | None = None) -> Any:
        future: Future = Future()
        with self._lock:
            if self._closed is not None:
                if sent is not None:
                    sent.set()  # it never will be sent
                raise closed_error(self._closed)
            self._replies[token] = future
        self._send((kind, token, *body), sent)
        try:
            return future.result(RPC_S)
        except FutureTimeout:
            with self._lock:
                self._replies.pop(token, None)
            if kind == "prepare":  # compiles run beside the loop: what is slow is the compile, not the engine
                self.forget([token])
                raise TimeoutError(
                    f"preparing the request (compiling its constraint, or its prompt logprobs) took more than "
                    f"{RPC_S:.0f} s in the engine process"
                ) from None
            raise TimeoutError(f"the engine process did not answer {kind} within {RPC_S:.0f} s") from None

    def _read(self) -> None:
        try:
            while True:
                kind, *body = self._conn.recv()
                if kind == "step":
                    self._apply(*body)
                elif kind == "reply":
                    self._answer(*body)
                elif kind == "closed":
                    self._end(*body)
                elif kind == "rejected":
                    self._reject(*body)
        except (EOFError, OSError):
            pass
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("the engine process's reader failed")
            self._end(f"its reader failed with {type(exc).__name__}: {exc}", None)
            return
        if self.process is None:
            self._end("the engine process closed this client's link", None)
            return
        self.process.join(5)
        self._end(f"the engine process exited with code {self.process.exitcode}", None)

    def _answer(self, token: int, ok: bool, payload: Any) -> None:
        with self._lock:
            future = self._replies.pop(token, None)
        if future is None:
            return
        if ok:
            future.set_result(payload)
        else:
            future.set_exception(payload)

    def _apply(self, updates: list[tuple], ids: list[int] = (), tokens: list[int] = ()) -> None:
        """One step's outputs into the mirrored sequences; their consumers are woken once. `ids` and
        `tokens`: sequences whose only news is one more token (core_process.py)."""
        touched: set[RequestHandle] = set()
        ending: set[RequestHandle] = set()
        done = []
        seqs = self._seqs
        for seq_id, token in zip(ids, tokens, strict=True):
            seq = seqs.get(seq_id)
            if seq is None:
                continue
            seq.output_ids.append(token)
            self.generation_tokens += 1
            if seq.sink is not None:
                seq.sink.post(("tokens", seq.index, len(seq.output_ids)))
                touched.add(seq.sink)
        for seq_id, ids, lps, ranks, tops, first, scheduled, cached, finished, reason, stop in updates:
            seq = self._seqs.get(seq_id)
            if seq is None:
                continue
            seq.output_ids += ids
            seq.logprobs += lps
            seq.ranks += ranks
            seq.top_logprobs += tops
            self.generation_tokens += len(ids)
            if seq.first_token_at is None:
                seq.first_token_at = first
            if seq.scheduled_at is None:
                seq.scheduled_at = scheduled
            seq.num_cached_tokens = cached
            if finished:
                seq.finish_reason, seq.stop_reason, seq.status = reason, stop, Status.FINISHED
                done.append(seq_id)
            if seq.sink is not None:
                seq.sink.post(("finish" if finished else "tokens", seq.index, len(seq.output_ids)))
                touched.add(seq.sink)
                if finished:
                    ending.add(seq.sink)
        EngineCore._wake(touched)
        with self._lock:
            for seq_id in done:
                self._seqs.pop(seq_id, None)
            for h in ending:  # only a handle one of whose sequences just finished can be done
                if all(s.finished for s in h.sequences):
                    self._live.discard(h)

    def _reject(self, seq_id: int, message: str) -> None:
        """The engine would not take the sequence (its adapter could not be read); its finish follows."""
        seq = self._seqs.get(seq_id)
        if seq is not None and seq.sink is not None:
            seq.sink.post(("rejected", message))

    def _end(self, reason: str, failure: BaseException | None) -> None:
        """The engine is gone: fail what waits on it, once."""
        with self._lock:
            if self._closed is None:
                self._closed = reason
                if failure is not None:
                    log.error("engine process closed: %s", reason)
            self.failure = self.failure or failure
            live, self._live = self._live, set()
            replies, self._replies = self._replies, {}
            self._seqs.clear()
        error = closed_error(self._closed)
        fail_each(live, str(error), log)
        for future in replies.values():
            if not future.done():
                future.set_exception(error)

    def forked(self) -> None:
        """In a forked child: closed, with a fresh lock, and never the one to stop the parent's engine."""
        _open_clients.discard(self)
        self._lock = threading.Lock()
        self._closed = FORKED
        self._live, self._replies, self._seqs = set(), {}, {}

    def close(self, reason: str = "close() was called") -> bool:
        """Tell the engine process to stop after its step, wait for it (JOIN_S), then end it. A link's
        client only detaches: the engine aborts its requests and goes on."""
        if self._closed == FORKED:
            return True
        _open_clients.discard(self)
        if not self.owner:
            self._end(reason, None)
            self._sender.put(("detach",))
            self._sender.close()
            # The engine closes its end on detach; the reader then sees EOF and leaves. The pipe is
            # closed only after that, never under a read in progress.
            self._reader.join(JOIN_S)
            self._conn.close()
            return not self._reader.is_alive()
        # Told even when its engine has failed: its main thread still waits for the parent's word.
        self._sender.put(("close", reason))
        self._sender.close()
        stopped = _wait_for_exit(self.process, JOIN_S)
        if not stopped:
            log.warning("the engine process did not stop within %.0f s; killing it", JOIN_S)
            self.process.kill()  # it ignores SIGTERM: signals are the parent's to act on
            self.process.join(5)
        self._end(reason, None)
        self._conn.close()
        return stopped


def _wait_for_exit(process: Any, timeout: float) -> bool:
    """Whether the process exited within `timeout`. Polled: its sentinel can turn readable a moment
    before the exit is reapable (seen as join() returning early with the process still alive)."""
    deadline = time.monotonic() + timeout
    while process.is_alive():
        if time.monotonic() > deadline:
            return False
        process.join(0.05)
        time.sleep(0.005)  # join returns at once while the sentinel is ready and the exit is not
    return True


def start_engine_process(recipe: Recipe) -> EngineCoreClient:
    """Spawn the engine process and wait for it to build its engine (or say why it could not)."""
    ctx = mp.get_context("spawn")  # a fresh interpreter: CUDA and threads in this one do not carry over
    parent, child = ctx.Pipe()
    process = ctx.Process(target=engine_process_main, args=(child, recipe), name="fastpath-engine-core")
    process.start()  # not a daemon: it may start tensor-parallel workers of its own
    child.close()
    try:
        kind, payload = _await_ready(parent, process)
    except BaseException:  # Ctrl-C during a long load, too: the child must not outlive this
        parent.close()
        process.kill()
        process.join(5)
        raise
    if kind == "failed":
        _wait_for_exit(process, JOIN_S)
        parent.close()
        raise payload
    return EngineCoreClient(parent, process, payload)


def _await_ready(parent: Any, process: Any) -> tuple[str, Any]:
    while not parent.poll(0.5):
        if not process.is_alive():
            raise EngineProcessError(_exited_early(process))
    try:
        return parent.recv()
    except EOFError:
        process.join(10)
        raise EngineProcessError(_exited_early(process)) from None


def _exited_early(process: Any) -> str:
    message = f"the engine process exited with code {process.exitcode} before it was ready"
    if process.exitcode == 1 and getattr(sys.modules.get("__main__"), "__file__", None):
        # A common cause in a script: spawn imports the script again in the child, which builds the
        # LLM again at its top level, and multiprocessing refuses to start a process from there.
        message += (
            " (its error is above); if this script builds the LLM at its top level, it needs "
            '`if __name__ == "__main__":` around that, since the engine process is started by spawn '
            "and imports the script again"
        )
    return message


_open_clients: weakref.WeakSet[EngineCoreClient] = weakref.WeakSet()


@atexit.register
def _close_open_clients() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: multiprocessing would
    # otherwise wait at exit for an engine process still waiting on this one.
    for client in list(_open_clients):
        client.close("the interpreter is exiting")
