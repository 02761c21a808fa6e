"""The engine process: an ordinary LLM whose loop publishes each step's outputs to its parent.

`LLM(..., engine_process=True)` spawns this process (engine/core_client.py is the parent's side).
It builds the engine exactly as the parent was asked to, then swaps the loop for one that sends one
message per step: every sequence's new token ids, logprobs and finish, nothing per token. Its main
thread reads the parent's messages (add, abort, prepare, stats, close) and answers them; a sender
thread does the pickling and writing, so a parent that falls behind never stalls a step.

The parent holds everything a consumer costs: detokenizing, stop strings, HTTP. Signals are the
parent's to act on: this process lets SIGINT and SIGTERM pass, and leaves when the parent says so
or its pipe closes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import queue
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .core import EngineCore
from .llm import peer_errors
from .prompt_logprobs import prompt_logprobs
from .sequence import Sequence

log = logging.getLogger("fastpath.engine")


@dataclass(frozen=True, slots=True)
class Recipe:
    """How the parent was asked to build its engine: the child builds the same one."""

    llm_cls: type
    model: Any
    kwargs: dict[str, Any]
    log_level: int


def portable_error(exc: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class PipeSender:
    """Sends messages down a pipe from a thread of its own, in the order they were put: whoever puts
    one never waits on a reader that is slow to drain (both sides of the engine process use it)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="fastpath-pipe-sender", daemon=True)
        self._thread.start()

    def put(self, message: tuple) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the parent is gone: nothing left to tell it
                return


class PublishingCore(EngineCore):
    """EngineCore whose outputs go to the parent as one message per step."""

    def __init__(self, executor: Any, errors: Any, publish: Any) -> None:
        self._publish = publish
        self._by_id: dict[int, Sequence] = {}
        self._sent: dict[int, tuple[int, int, int]] = {}  # seq_id -> ids, logprobs, top-k sent
        super().__init__(executor, errors)

    def submit_sequences(self, seqs: list[Sequence]) -> None:
        from .request import closed_error

        with self._lock:
            if self._closed is not None:
                raise closed_error(self._closed)
            for seq in seqs:
                self._by_id[seq.seq_id] = seq
            self._incoming.extend(seqs)
            self._work.notify()

    def abort_ids(self, seq_ids: list[int]) -> None:
        with self._lock:
            seqs = [self._by_id[i] for i in seq_ids if i in self._by_id]
        for seq in seqs:
            self.abort(seq)

    def _deliver(self, record: Any) -> None:
        now = self._count(record)
        updates, seen = [], set()
        for seq, _ in record.new_tokens:
            if seq.first_token_at is None:
                seq.first_token_at = now
            if seq.streams and not seq.finished and seq.seq_id not in seen:
                seen.add(seq.seq_id)
                updates.append(self._update(seq))
        updates += [self._update(seq) for seq in record.finished]
        if updates:
            self._publish(("step", updates))

    def _report_finish(self, seq: Sequence) -> None:
        self._publish(("step", [self._update(seq)]))

    def _update(self, seq: Sequence) -> tuple:
        """What the parent has not yet heard of this sequence."""
        ids, lps, tops = self._sent.get(seq.seq_id, (0, 0, 0))
        update = (
            seq.seq_id,
            seq.output_ids[ids:],
            seq.logprobs[lps:],
            seq.top_logprobs[tops:],
            seq.first_token_at,
            seq.scheduled_at,
            seq.finished,
            seq.finish_reason,
            seq.stop_reason,
        )
        if seq.finished:
            self._sent.pop(seq.seq_id, None)
            with self._lock:
                self._by_id.pop(seq.seq_id, None)
        else:
            self._sent[seq.seq_id] = (len(seq.output_ids), len(seq.logprobs), len(seq.top_logprobs))
        return update

    def _fail_pending(self, error: Exception) -> None:
        failure = portable_error(self.failure) if self.failure is not None else None
        self._publish(("closed", self._closed or str(error), failure))  # the reason; the parent words it
        super()._fail_pending(error)


class ParentLink:
    """The child's side of the pipe: admits, aborts and answers until the parent says close."""

    def __init__(self, conn: Any, llm: Any, core: PublishingCore, publisher: PipeSender) -> None:
        self.conn, self.llm, self.core, self.publisher = conn, llm, core, publisher
        self._prepared: dict[int, list[Any]] = {}  # guided states compiled for a request not yet added
        # Compiling a grammar can take a while: off this thread, so adds and aborts go on meanwhile.
        # The parent sends a request's add only after its prepare's reply, so the states are there.
        self._compiler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fastpath-engine-prepare")

    def serve(self) -> str:
        """Until close or a closed pipe; the reason to stop."""
        handlers = {
            "add": self._add,
            "abort": lambda ids: self.core.abort_ids(ids),
            "prepare": lambda *body: self._compiler.submit(self._prepare, *body),
            "forget": lambda tokens: [self._prepared.pop(t, None) for t in tokens],
            "stats": lambda token: self._reply(token, True, self.core.stats()),
        }
        while True:
            try:
                kind, *body = self.conn.recv()
            except (EOFError, OSError):
                return "the parent process went away"
            if kind == "close":
                return body[0]
            handlers[kind](*body)

    def stop(self) -> None:
        """Let a prepare under way finish (its caller waits for the reply); start no other."""
        self._compiler.shutdown(wait=True, cancel_futures=True)

    def _reply(self, token: int, ok: bool, payload: Any) -> None:
        self.publisher.put(("reply", token, ok, payload))

    def _prepare(self, token: int, prompt_ids: list[int], params: Any) -> None:
        """Compile a request's constraint and take its prompt logprobs; a bad one fails alone."""
        llm = self.llm
        try:
            guided = None
            if params.guided is not None:
                guided = [llm._guided_state(params.guided) for _ in range(params.n)]
            plp = None
            if params.prompt_logprobs is not None:
                plp = self.core.call(
                    lambda: prompt_logprobs(llm.executor, prompt_ids, params.prompt_logprobs, llm.tokenizer)
                )
        except Exception as exc:
            self._reply(token, False, portable_error(exc))
            return
        if guided is not None:
            self._prepared[token] = guided
        self._reply(token, True, plp)

    def _add(self, items: list[tuple]) -> None:
        seqs = []
        limits = self.llm._limits
        for token, prompt_ids, params, streams, members in items:
            guided = self._prepared.pop(token, None) if token is not None else None
            for k, (seq_id, index, seed) in enumerate(members):
                seq = Sequence(
                    seq_id,
                    list(prompt_ids),
                    params,
                    seed,
                    self.llm.eos_ids,
                    limits.max_seq_len,
                    index=index,
                    guided=guided[k] if guided is not None else None,
                )
                seq.streams = streams
                seqs.append(seq)
        with contextlib.suppress(Exception):  # a closed engine has told the parent already
            self.core.submit_sequences(seqs)


def engine_process_main(conn: Any, recipe: Recipe) -> None:
    """The child's entry point (spawned by core_client.start_engine_process)."""
    # Handled, not ignored: an ignored signal stays ignored in the tensor-parallel workers this
    # process starts, and their supervisor stops them with SIGTERM.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _parents_to_act_on)
    logging.basicConfig(level=recipe.log_level, format="%(levelname)s %(name)s: %(message)s")
    publisher = PipeSender(conn)
    try:
        llm = recipe.llm_cls(recipe.model, **recipe.kwargs)
    except BaseException as exc:
        publisher.put(("failed", portable_error(exc)))
        publisher.close()
        return
    # The engine was built with an ordinary loop; its replacement publishes to the parent.
    llm.core.close("replaced by the engine process's loop")
    core = PublishingCore(llm.executor, functools.partial(peer_errors, llm.parallel), publisher.put)
    executor = type(llm.executor)
    publisher.put(
        ("ready", {
            "config": llm.config,
            "limits": llm._limits,
            "executor": f"{executor.__module__}.{executor.__qualname__}",
            "pid": os.getpid(),
        })
    )  # fmt: skip
    reason = "the engine process stopped"
    link = ParentLink(conn, llm, core, publisher)
    try:
        reason = link.serve()
    finally:
        link.stop()
        core.close(reason)
        llm.close()
        publisher.close()


def _parents_to_act_on(signum: int, frame: Any) -> None:
    """Ctrl-C reaches the whole process group; the parent drains and then says close."""
