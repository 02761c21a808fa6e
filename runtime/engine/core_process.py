"""The engine process: an ordinary LLM whose loop publishes each step's outputs to its parent.

`LLM(..., engine_process=True)` spawns this process (engine/core_client.py is the parent's side).
It builds the engine exactly as the parent was asked to, then swaps the loop for one that sends one
message per step: every sequence's new token ids, logprobs and finish, nothing per token. Its main
thread reads the parent's messages (add, abort, prepare, forget, stats, link, close) and answers
them; a sender thread does the pickling and writing, so a parent that falls behind never stalls a step.

The parent may open more links (`EngineCoreClient.open_link`) and hand them to other processes, the
API servers of `fastpath serve --api-server-count N`: each link's requests and outputs are its own,
and a link that closes (or says detach) aborts its requests. Only the parent's link closes the engine.

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
from multiprocessing import connection
from typing import Any

from .core import EngineCore
from .gil import prompt_handoffs
from .heap import freeze_startup_heap
from .llm import peer_errors
from .prompt_logprobs import prompt_logprobs_when_room
from .sequence import Sequence

log = logging.getLogger("fastpath.engine")

_NONE = (0, 0, 0)  # a sequence nothing was sent of yet


@dataclass(frozen=True, slots=True)
class Recipe:
    """How the parent was asked to build its engine: the child builds the same one."""

    llm_cls: type
    model: Any
    kwargs: dict[str, Any]
    log_level: int


def sealed(body: tuple) -> bytes:
    """A request's own objects, pickled apart from the message that carries them: one the engine
    process cannot rebuild (a class of the caller's `__main__`) fails that request alone, by the ids
    the message carries in the clear. Raises ValueError for one that does not pickle here."""
    try:
        return pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise ValueError(
            f"the request cannot be sent to the engine process: {type(exc).__name__}: {exc}"
        ) from None


def unsealed(blob: bytes) -> tuple[tuple | None, str | None]:
    """(the body, None), or (None, why the engine process could not rebuild it)."""
    try:
        return pickle.loads(blob), None
    except Exception as exc:
        log.warning("a request could not be rebuilt in the engine process: %s: %s", type(exc).__name__, exc)
        return None, (
            f"the engine process could not rebuild this request ({type(exc).__name__}: {exc}); pass "
            "objects it can import (not classes defined in __main__ or inside functions)"
        )


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

    def put(self, message: tuple, sent: threading.Event | None = None) -> None:
        """Queue `message`; `sent` is set once it is written (or can no longer be)."""
        self._queue.put((message, sent))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            message, sent = item
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the other side is gone: nothing left to tell it
                self._release_waiters(sent)
                return
            except Exception:  # it did not pickle (nothing was written): drop it, keep the pipe
                log.exception("a %r message could not be sent to the other process", message[0])
            if sent is not None:
                sent.set()

    def _release_waiters(self, sent: threading.Event | None) -> None:
        while True:
            if sent is not None:
                sent.set()
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            sent = item[1] if item is not None else None


class ClientLink:
    """One client of the engine process: its pipe, the sender that writes to it, and the constraints
    compiled for its requests not yet added."""

    def __init__(self, conn: Any, owner: bool) -> None:
        self.conn, self.owner = conn, owner
        self.publisher = PipeSender(conn)
        self.prepared: dict[int, list[Any]] = {}
        # A client that gave up waiting (its round trip timed out) forgets a prepare still compiling:
        # its states are dropped when the compile ends, not kept for an add that never comes.
        self._compiling: set[int] = set()
        self._forgotten: set[int] = set()
        self._lock = threading.Lock()

    def put(self, message: tuple) -> None:
        self.publisher.put(message)

    def compiling(self, token: int) -> None:
        with self._lock:
            self._compiling.add(token)

    def keep(self, token: int, states: list[Any] | None) -> None:
        """A prepare's end: hold its states for the request's add, unless its client forgot it."""
        with self._lock:
            self._compiling.discard(token)
            if token in self._forgotten:
                self._forgotten.discard(token)
            elif states is not None:
                self.prepared[token] = states

    def forget(self, tokens: list[int]) -> None:
        with self._lock:
            for t in tokens:
                self.prepared.pop(t, None)
                if t in self._compiling:
                    self._forgotten.add(t)


class PublishingCore(EngineCore):
    """EngineCore whose outputs go, as one message per step, to the link each sequence came from."""

    def __init__(self, executor: Any, errors: Any) -> None:
        self._by_id: dict[int, Sequence] = {}
        self._link_of: dict[int, ClientLink] = {}  # seq_id -> the link it came from
        self._links: list[ClientLink] = []
        self._sent: dict[int, tuple[int, int, int]] = {}  # seq_id -> ids, logprobs, top-k sent
        super().__init__(executor, errors)

    def add_link(self, link: ClientLink) -> None:
        with self._lock:
            self._links.append(link)

    def submit_sequences(self, seqs: list[Sequence], link: ClientLink) -> None:
        from .request import closed_error

        with self._lock:
            if self._closed is not None:
                raise closed_error(self._closed)
            for seq in seqs:
                self._by_id[seq.seq_id] = seq
                self._link_of[seq.seq_id] = link
            self._incoming.extend(seqs)
            self._work.notify()

    def abort_ids(self, seq_ids: list[int]) -> None:
        with self._lock:
            seqs = [self._by_id[i] for i in seq_ids if i in self._by_id]
        for seq in seqs:
            self.abort(seq)

    def drop_link(self, link: ClientLink) -> None:
        """A client that went away: its requests end (freeing their blocks), and nothing more is sent to it."""
        with self._lock:
            if link in self._links:
                self._links.remove(link)
            ids = [i for i, owner in self._link_of.items() if owner is link]
        self.abort_ids(ids)

    def _deliver(self, record: Any) -> None:
        now = self._count(record)
        updates: dict[ClientLink, list[tuple]] = {}
        # Most rows of a step are a streaming sequence's one new token and nothing else: those go as
        # two lists of ints (ids, tokens), a few µs a step to build and pickle at batch 64, where a
        # full update per row cost the loop and the sender thread, sharing a GIL, 1-2 µs each.
        plain: dict[ClientLink, tuple[list[int], list[int]]] = {}
        sent, link_of = self._sent, self._link_of
        seen = set()
        for seq, token in record.new_tokens:
            first = seq.first_token_at is None
            if first:
                seq.first_token_at = now
            if not seq.streams or seq.finished or seq.seq_id in seen:
                continue
            seen.add(seq.seq_id)
            n = len(seq.output_ids)
            link = link_of.get(seq.seq_id)
            if (
                first
                or seq.params.logprobs is not None
                or link is None
                or sent.get(seq.seq_id, _NONE)[0] != n - 1
            ):
                self._add_update(updates, seq)
                continue
            sent[seq.seq_id] = (n, 0, 0)
            ids, tokens = plain.get(link) or plain.setdefault(link, ([], []))
            ids.append(seq.seq_id)
            tokens.append(token)
        for seq in record.finished:
            self._add_update(updates, seq)
        self._publish(updates, plain)

    def refuse(self, link: ClientLink, seq_ids: list[int], message: str) -> None:
        """Sequences that never became Sequences here (unsealed failed): rejected and finished, as
        _reject does for one the scheduler would not take."""
        for seq_id in seq_ids:
            link.put(("rejected", seq_id, message))
        finished = [(i, [], [], [], [], None, None, 0, True, "abort", None) for i in seq_ids]
        link.put(("step", finished, (), ()))

    def _reject(self, seq: Sequence, message: str) -> None:
        # Before its finish, on the same link: the client's handle fails alone with the message.
        link = self._link_of.get(seq.seq_id)
        if link is not None:
            link.put(("rejected", seq.seq_id, message))
        super()._reject(seq, message)

    def _report_finish(self, seq: Sequence) -> None:
        updates: dict[ClientLink, list[tuple]] = {}
        self._add_update(updates, seq)
        self._publish(updates)

    @staticmethod
    def _publish(
        updates: dict[ClientLink, list[tuple]],
        plain: dict[ClientLink, tuple[list[int], list[int]]] | None = None,
    ) -> None:
        """One message per link: ("step", full updates, plain ids, their tokens)."""
        for link in {*updates, *(plain or ())}:
            ids, tokens = plain.get(link, ((), ())) if plain else ((), ())
            link.put(("step", updates.get(link, []), ids, tokens))

    def _add_update(self, updates: dict[ClientLink, list[tuple]], seq: Sequence) -> None:
        link = self._link_of.get(seq.seq_id)
        update = self._update(seq)
        if link is not None:
            updates.setdefault(link, []).append(update)

    def _update(self, seq: Sequence) -> tuple:
        """What the sequence's client has not yet heard of it."""
        ids, lps, tops = self._sent.get(seq.seq_id, (0, 0, 0))
        update = (
            seq.seq_id,
            seq.output_ids[ids:],
            seq.logprobs[lps:],
            seq.ranks[lps:],  # one per logprob
            seq.top_logprobs[tops:],
            seq.first_token_at,
            seq.scheduled_at,
            seq.num_cached_tokens,
            seq.finished,
            seq.finish_reason,
            seq.stop_reason,
        )
        if seq.finished:
            self._sent.pop(seq.seq_id, None)
            with self._lock:
                self._by_id.pop(seq.seq_id, None)
                self._link_of.pop(seq.seq_id, None)
        else:
            self._sent[seq.seq_id] = (len(seq.output_ids), len(seq.logprobs), len(seq.top_logprobs))
        return update

    def _fail_pending(self, error: Exception) -> None:
        failure = portable_error(self.failure) if self.failure is not None else None
        with self._lock:
            links = list(self._links)
        for link in links:  # the reason; each client words it
            link.put(("closed", self._closed or str(error), failure))
        super()._fail_pending(error)


class LinkServer:
    """The engine process's main thread: admits, aborts and answers on every link until the parent's
    link says close (or closes)."""

    def __init__(self, llm: Any, core: PublishingCore, parent: ClientLink) -> None:
        self.llm, self.core = llm, core
        self._links = {parent.conn: parent}
        # Compiling a grammar can take a while: off this thread, so adds and aborts go on meanwhile.
        # A client sends a request's add only after its prepare's reply, so the states are there.
        self._compiler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fastpath-engine-prepare")

    def serve(self) -> str:
        """Until close or a closed parent pipe; the reason to stop."""
        handlers = {
            "add": self._add,
            "abort": lambda link, ids: self.core.abort_ids(ids),
            "prepare": self._submit_prepare,
            "forget": lambda link, tokens: link.forget(tokens),
            "stats": lambda link, token: self._answer(link, token, self.core.stats),
            "reset_prefix_cache": self._submit_reset,
            "pool": self._submit_pool,
            "link": self._open,
        }
        while True:
            for conn in connection.wait(list(self._links)):
                link = self._links[conn]
                try:
                    kind, *body = conn.recv()
                except (EOFError, OSError):
                    if link.owner:
                        return "the parent process went away"
                    self._drop(link)
                    continue
                except Exception:  # read whole, then unpickled: the pipe stays in step
                    # One client's object this process cannot rebuild (a class of its __main__) is
                    # not a reason to stop serving every other.
                    log.exception("a message from a client could not be unpickled here; dropped")
                    continue
                if kind == "close" and link.owner:
                    return body[0]
                if kind in ("close", "detach"):
                    self._drop(link)
                    continue
                handlers[kind](link, *body)

    def stop(self) -> None:
        """Let a prepare under way finish (its caller waits for the reply); start no other."""
        self._compiler.shutdown(wait=True, cancel_futures=True)

    def close_links(self) -> None:
        """End every link's sender once it has sent what it holds (the engine's close), the parent's last."""
        for link in sorted(self._links.values(), key=lambda link: link.owner):
            link.publisher.close()

    def _open(self, link: ClientLink, token: int, conn: Any) -> None:
        """The parent hands over a pipe for another process's client."""
        if not link.owner:
            self._reply(link, token, False, ValueError("only the engine's parent opens links"))
            return
        new = ClientLink(conn, owner=False)
        self._links[conn] = new
        self.core.add_link(new)
        self._reply(link, token, True, None)

    def _drop(self, link: ClientLink) -> None:
        self._links.pop(link.conn, None)
        self.core.drop_link(link)
        link.publisher.close()
        link.conn.close()

    def _reply(self, link: ClientLink, token: int, ok: bool, payload: Any) -> None:
        link.put(("reply", token, ok, payload))

    def _answer(self, link: ClientLink, token: int, fn: Any) -> None:
        """fn()'s result as the reply, or its error: a closed core's refusal goes back to the caller
        instead of ending this loop (or leaving the caller waiting)."""
        try:
            out = fn()
        except Exception as exc:
            self._reply(link, token, False, portable_error(exc))
        else:
            self._reply(link, token, True, out)

    def _submit_reset(self, link: ClientLink, token: int) -> None:
        # It waits for the loop thread between steps: off the pipe reader, as a prepare is.
        self._compiler.submit(self._answer, link, token, self.core.reset_prefix_cache)

    def _submit_pool(
        self, link: ClientLink, token: int, prompts: list, pooling_type: str, per_token: bool, loras: list
    ) -> None:
        # It waits for the loop thread between steps: off the pipe reader, as a prepare is.
        def run() -> None:
            try:
                out = self.core.call(lambda: self.llm.executor.pool(prompts, pooling_type, per_token, loras))
            except Exception as exc:
                self._reply(link, token, False, portable_error(exc))
                return
            self._reply(link, token, True, out)

        self._compiler.submit(run)

    def _submit_prepare(self, link: ClientLink, token: int, blob: bytes) -> None:
        body, why = unsealed(blob)
        if body is None:
            self._reply(link, token, False, ValueError(why))
            return
        link.compiling(token)  # on the reading thread, so a forget read after it finds it
        self._compiler.submit(self._prepare, link, token, *body)

    def _prepare(
        self, link: ClientLink, token: int, prompt_ids: list[int], params: Any, lora: Any = None
    ) -> None:
        """Compile a request's constraint and take its prompt logprobs; a bad one fails alone."""
        llm = self.llm
        try:
            guided = None
            if params.guided is not None:
                guided = [llm._guided_state(params.guided, prompt_ids) for _ in range(params.n)]
            plp = None
            if params.prompt_logprobs is not None:
                plp = prompt_logprobs_when_room(
                    self.core,
                    llm.executor,
                    prompt_ids,
                    params.prompt_logprobs,
                    llm.tokenizer if params.detokenize else None,  # no text asked for: none spelled
                    lora,
                )
        except Exception as exc:
            link.keep(token, None)
            self._reply(link, token, False, portable_error(exc))
            return
        link.keep(token, guided)
        self._reply(link, token, True, plp)

    def _add(self, link: ClientLink, sealed_params: list[bytes], items: list[tuple]) -> None:
        seqs = []
        limits = self.llm._limits
        shared = [unsealed(blob) for blob in sealed_params]  # (params, why): once for the items sharing it
        for token, seq_ids, which, blob in items:
            guided = link.prepared.pop(token, None) if token is not None else None
            params, why = shared[which]
            body, why = unsealed(blob) if params is not None else (None, why)
            if body is None:
                self.core.refuse(link, seq_ids, why)
                continue
            prompt_ids, streams, members, biases, lora, salt = body
            for k, (seq_id, index, seed) in enumerate(members):
                seq = Sequence(
                    seq_id,
                    list(prompt_ids),
                    params,
                    seed,
                    self.llm.eos_ids,
                    limits.max_seq_len,
                    index=index,
                    primary_eos=self.llm.primary_eos,
                    guided=guided[k] if guided is not None else None,
                    biases=biases,
                    lora=lora,
                    cache_salt=salt,
                )
                seq.streams = streams
                seqs.append(seq)
        with contextlib.suppress(Exception):  # a closed engine has told the client already
            self.core.submit_sequences(seqs, link)


def engine_process_main(conn: Any, recipe: Recipe) -> None:
    """The child's entry point (spawned by core_client.start_engine_process)."""
    # Handled, not ignored: an ignored signal stays ignored in the tensor-parallel workers this
    # process starts, and their supervisor stops them with SIGTERM.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _parents_to_act_on)
    logging.basicConfig(level=recipe.log_level, format="%(levelname)s %(name)s: %(message)s")
    prompt_handoffs()  # the loop, the pipe reader and the senders hand every step across threads
    parent = ClientLink(conn, owner=True)
    try:
        llm = recipe.llm_cls(recipe.model, **recipe.kwargs)
    except BaseException as exc:
        parent.put(("failed", portable_error(exc)))
        parent.publisher.close()
        return
    # The engine was built with an ordinary loop; its replacement publishes to the clients.
    llm.core.close("replaced by the engine process's loop")
    core = PublishingCore(llm.executor, functools.partial(peer_errors, llm.parallel))
    core.add_link(parent)
    executor = type(llm.executor)
    # The model and its imports: no later collection walks them (engine/heap.py).
    frozen = freeze_startup_heap("engine process: ")
    parent.put(
        ("ready", {
            "config": llm.config,
            "gc_frozen": frozen,
            "limits": llm._limits,
            "executor": f"{executor.__module__}.{executor.__qualname__}",
            "pid": os.getpid(),
        })
    )  # fmt: skip
    reason = "the engine process stopped"
    links = LinkServer(llm, core, parent)
    try:
        reason = links.serve()
    finally:
        links.stop()
        core.close(reason)
        llm.close()
        links.close_links()


def _parents_to_act_on(signum: int, frame: Any) -> None:
    """Ctrl-C reaches the whole process group; the parent drains and then says close."""
