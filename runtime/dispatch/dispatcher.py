"""Host callbacks on the current CUDA stream, through any dispatch mode.

`launch_hostfunc(fn, *args)` enqueues ``fn(*args)`` on torch's current stream, eagerly or into
the CUDA graph being captured, and returns at once; a host thread runs it when the stream gets
there, and the stream waits for it. Modes (DESIGN.md, "Host dispatch"):

- ``blocking``: ``cudaLaunchHostFunc``.
- ``spin``: low latency. ``hostfunc_v2`` (CUDA 13.2+), else the ``doorbell`` (the stream writes a
  request flag and waits for the host's answer; a spinning worker runs the callback), else
  ``blocking``; a fall back warns once per process, or raises where ``on_unsupported="error"``
  and only ``blocking`` is left. The doorbell's ``ring`` (an engine option) is how the stream
  writes and waits: ``queue`` (one kernel appends to a queue the worker serves in order),
  ``kernel`` (one poll kernel), ``batched`` (one batched memory operation) or ``memops`` (two);
  ``auto`` takes the first that self-tests, in that order.
- A callback launched with ``wait=False`` is posted: on the queue ring the stream goes on without
  waiting for it (``HostDispatcher.posts``); elsewhere it waits like any other. Posted callbacks
  still run once per launch or replay, in stream order, and ``synchronize()`` waits for them.
- ``auto``: the best that works here, silently.
- ``inline``: on the launching thread, at launch. Without CUDA every mode runs inline, in order.

An exception raised by a callback is kept and re-raised, with its traceback, by the next
`check()` (or `HostDispatcher.synchronize()`). Graph replays must be announced so the doorbell
worker spins only while callbacks are due: capture with `HostDispatcher.graph(g)` and replay
with `HostDispatcher.replay(g)`.

Importing this module touches neither torch nor CUDA.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fastpath.vocab import DISPATCH_MODES

NATIVE_EXTENSION = "fastpath.runtime._hostdispatch"
SIMULATE_ABSENT_ENV = "FASTPATH_HOSTDISPATCH_SIMULATE_ABSENT"  # e.g. "hostfunc_v2,memops" (tests)
MODES = ("inline", *DISPATCH_MODES)


class HostDispatchWarning(RuntimeWarning):
    """Host dispatch works, but not the way it was asked to."""


class HostDispatchFallbackWarning(HostDispatchWarning):
    """The spin chain fell back (shown once per process)."""


class HostDispatchUnsupportedError(RuntimeError):
    """`spin` cannot spin here and `on_unsupported="error"` forbids falling back to blocking."""


@dataclass(frozen=True, slots=True)
class ShutdownReport:
    drained: bool  # everything launched or announced ran within the bound
    not_run: tuple[str, ...]  # eager callbacks that will not run
    graph_callbacks_not_run: int  # announced replays' callbacks that will not run
    graph_callbacks_alive: int  # held by live graphs; their replays are answered without running
    waited_s: float
    errors: tuple[BaseException, ...]  # raised by callbacks and not yet re-raised by check()
    still_running: int = 0  # callbacks that had not returned when the bound ran out


@dataclass(slots=True)
class CapturedCallbacks:
    callbacks: int = 0  # set when the capture ends: what each replay fires


_fallback_warned_pid: int | None = None


def _warn_fallback_once(message: str) -> None:
    global _fallback_warned_pid
    if _fallback_warned_pid == os.getpid():
        return
    _fallback_warned_pid = os.getpid()
    warnings.warn(message, HostDispatchFallbackWarning, stacklevel=3)


def _reset_fallback_warning() -> None:
    """Test hook: let the next fall back warn again."""
    global _fallback_warned_pid
    _fallback_warned_pid = None


def _simulated_absent_from_env() -> list[str]:
    return [name.strip() for name in os.environ.get(SIMULATE_ABSENT_ENV, "").split(",") if name.strip()]


def _load_extension(extension: ModuleType | str | None) -> ModuleType:
    if extension is None:
        extension = NATIVE_EXTENSION
    return importlib.import_module(extension) if isinstance(extension, str) else extension


def _torch_cuda_ready() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class HostDispatcher:
    """One host-dispatch engine on one extension module (the native binding or a generated one).

    ``device``: ``"auto"`` (CUDA when torch has it, else CPU), ``"cuda"``,
    ``"cuda:N"``, ``"cpu"``, or an extension's ``SimDevice`` (tests). ``stream``: what
    `launch` enqueues on when given none: torch's current stream on CUDA; a ``SimStream``, a
    handle or a callable returning one for a simulated device.
    """

    def __init__(
        self,
        mode: str | None = None,
        on_unsupported: str | None = None,
        *,
        extension: ModuleType | str | None = None,
        device: Any = "auto",
        stream: Any = None,
        **engine_options: Any,
    ) -> None:
        self.extension = _load_extension(extension)
        if device == "auto":  # an extension without CUDA then says so, and runs inline after a sync
            device = "cuda" if _torch_cuda_ready() else "cpu"
        engine_options.setdefault("simulate_absent", _simulated_absent_from_env())
        try:
            self._engine = self.extension.Engine(mode, on_unsupported, device, **engine_options)
        except self.extension.UnsupportedModeError as e:
            raise HostDispatchUnsupportedError(str(e)) from e
        self._default_stream = self._stream_source(device, stream)
        # Torch runs CUDA work but this engine cannot enqueue on it: run inline after a sync.
        self._sync_inline = not self._engine.has_device and device != "cpu" and _torch_cuda_ready()
        self._graph_callbacks: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._unannounced_seen = 0
        self._posts = bool(self._engine.info()["posts"])  # fixed for the engine's life
        if self._engine.fallback:
            _warn_fallback_once(self._engine.fallback)

    def _stream_source(self, device: Any, stream: Any) -> Callable[[], int]:
        if stream is not None:
            return (
                stream if callable(stream) and not hasattr(stream, "handle") else lambda: _handle_of(stream)
            )
        if self._engine.has_device and isinstance(device, str) and device.startswith("cuda"):
            import torch

            return lambda: torch.cuda.current_stream().cuda_stream
        if self._engine.has_device:
            raise ValueError("a simulated device needs stream= (a SimStream, a handle, or a callable)")
        return lambda: 0

    def _handle(self, stream: Any) -> int:
        return self._default_stream() if stream is None else _handle_of(stream)

    # ---- launching ----

    def launch(self, fn: Callable[..., Any], *args: Any, wait: bool = True) -> None:
        """Enqueue ``fn(*args)`` on the current stream (or into the graph being captured).

        ``wait=False`` posts it: the stream goes on without waiting for it, where the backend can
        post (`posts`); it still runs once per launch or replay, in stream order.
        """
        if self._sync_inline:
            _sync_torch_stream_for_inline()
        self._engine.launch(self._default_stream(), fn, *args, wait=wait)

    def launch_on(self, stream: Any, fn: Callable[..., Any], *args: Any, wait: bool = True) -> None:
        self._engine.launch(self._handle(stream), fn, *args, wait=wait)

    def launch_token_ready(
        self, flag: Any, step: int | None = None, stream: Any = None, *, wait: bool = True
    ) -> None:
        """A C++ callback (no GIL) marking ``step`` of ``flag`` ready; the next step when None."""
        if self._sync_inline:
            _sync_torch_stream_for_inline()
        self._engine.launch_token_ready(self._handle(stream), flag, step, wait)

    def token_ready_flag(self) -> Any:
        return self.extension.TokenReadyFlag()

    def launch_guided_fill(self, fill: Any, stream: Any = None) -> None:
        """A C++ callback (no GIL) running the next step of ``fill``, an ``extension.GuidedFill``."""
        if self._sync_inline:
            _sync_torch_stream_for_inline()
        self._engine.launch_guided_fill(self._handle(stream), fill)

    # ---- graphs ----

    @contextmanager
    def capture(self, graph: Any = None, stream: Any = None) -> Iterator[CapturedCallbacks]:
        """Count the callbacks launched inside a capture already running on ``stream``.

        Until it ends, references that callbacks dropped off the GIL are not freed: freeing one
        can free CUDA resources, and that must not land in a capture.
        """
        capture_id = self._begin_capture(stream)
        record = CapturedCallbacks()
        try:
            yield record
        finally:
            self._end_capture(capture_id, graph, record)

    @contextmanager
    def graph(self, cuda_graph: Any, **graph_kwargs: Any) -> Iterator[CapturedCallbacks]:
        """``torch.cuda.graph(cuda_graph, **graph_kwargs)`` that also counts its host callbacks."""
        import torch

        record, capture_id = CapturedCallbacks(), None
        try:
            with torch.cuda.graph(cuda_graph, **graph_kwargs):
                capture_id = self._begin_capture(None)
                yield record
        finally:  # after torch ended the capture
            if capture_id is not None:
                self._end_capture(capture_id, cuda_graph, record)

    def _begin_capture(self, stream: Any) -> int:
        capture_id = self._engine.capture_id(self._handle(stream))
        if capture_id is None:
            raise RuntimeError("HostDispatcher.capture() needs a stream that is being captured into a graph")
        return capture_id

    def _end_capture(self, capture_id: int, graph: Any, record: CapturedCallbacks) -> None:
        record.callbacks = self._engine.take_capture(capture_id)
        if graph is not None:
            self.register_graph(graph, record.callbacks)

    def register_graph(self, graph: Any, callbacks: int) -> None:
        """Remember how many callbacks each replay of ``graph`` fires (see `replay`)."""
        try:
            self._graph_callbacks[graph] = callbacks
        except TypeError:  # not weakly referenceable: keep the count on the graph itself
            graph._fastpath_host_callbacks = callbacks
        with contextlib.suppress(AttributeError):  # the graph keeps its dispatcher (and errors) alive
            graph._fastpath_host_dispatcher = self

    def callbacks_of(self, graph: Any) -> int:
        """How many callbacks a replay of ``graph`` fires, as registered (0 if never)."""
        try:
            return self._graph_callbacks.get(graph, 0)
        except TypeError:
            return getattr(graph, "_fastpath_host_callbacks", 0)

    def replay(self, graph: Any, *args: Any, **kwargs: Any) -> None:
        """Announce the graph's callbacks, then ``graph.replay(*args, **kwargs)``."""
        n = self.callbacks_of(graph)
        if n:
            self._engine.announce(n)
        try:
            graph.replay(*args, **kwargs)
        except BaseException:
            if n:
                self._engine.announce(-n)
            raise

    def announce(self, callbacks: int) -> None:
        """A replay will fire this many captured callbacks (for graphs replayed some other way)."""
        self._engine.announce(callbacks)

    # ---- errors, state, shutdown ----

    def check(self) -> None:
        """Re-raise the oldest exception a callback raised since the last check, with its traceback."""
        errors, raised = self._engine.take_errors()
        self._warn_unannounced()
        if not errors:
            return
        exc, fn = errors[0]
        if hasattr(exc, "add_note"):
            note = f"raised by host callback {fn!r} on the {self.backend!r} host-dispatch backend"
            if raised > 1:
                others = ", ".join(repr(f) for _, f in errors[1:4])
                note += f"; {raised - 1} more callback(s) raised since the last check ({others})"
            exc.add_note(note)
        raise exc

    def synchronize(self, stream: Any = None) -> None:
        """Wait for the stream, then `check()`.

        Once posted callbacks have been used, it also waits until every callback launched or
        announced so far has run, on any stream. Never call it from a callback.
        """
        self._engine.synchronize(self._handle(stream))
        self.check()

    def _warn_unannounced(self) -> None:
        if self._engine.backend != "doorbell":
            return
        unannounced = self._engine.info()["unannounced"]
        if unannounced > self._unannounced_seen and self._unannounced_seen == 0:
            warnings.warn(
                f"{unannounced} graph host callback(s) fired with no replay announced, so the doorbell "
                "worker found them by polling; replay graphs with HostDispatcher.replay(g) or call announce(n)",
                HostDispatchWarning,
                stacklevel=3,
            )
        self._unannounced_seen = unannounced

    def info(self) -> dict[str, Any]:
        info = self._engine.info()
        info["extension"] = self.extension.__name__
        info["fixed_mode"] = self.extension.FIXED_MODE
        return info

    def shutdown(self, timeout: float = 5.0) -> ShutdownReport:
        """Wait up to ``timeout`` for pending callbacks, then stop running any; never hangs."""
        out = self._engine.shutdown(timeout)
        errors, _ = self._engine.take_errors()
        return ShutdownReport(
            drained=out["drained"],
            not_run=tuple(out["not_run"]),
            graph_callbacks_not_run=out["graph_callbacks_not_run"],
            graph_callbacks_alive=out["graph_callbacks_alive"],
            waited_s=out["waited_s"],
            errors=tuple(exc for exc, _ in errors),
            still_running=out.get("still_running", 0),
        )

    @property
    def engine(self) -> Any:
        """The extension's Engine, for what this class does not wrap (e.g. ``launch_log``)."""
        return self._engine

    def stream_handle(self, stream: Any = None) -> int:
        """The handle `launch` would use, or that of ``stream``."""
        return self._handle(stream)

    @property
    def posts(self) -> bool:
        """Whether a posted callback (``wait=False``) lets its stream go on: the doorbell's queue ring."""
        return self._posts

    @property
    def backend(self) -> str:
        return self._engine.backend

    @property
    def mode(self) -> str:
        return self._engine.mode

    @property
    def on_unsupported(self) -> str:
        return self._engine.on_unsupported

    @property
    def reason(self) -> str:
        return self._engine.reason

    @property
    def fallback(self) -> str | None:
        return self._engine.fallback


def _handle_of(stream: Any) -> int:
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "handle"):  # a torch.cuda.Stream, a SimStream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"not a stream: {stream!r}")


def _sync_torch_stream_for_inline() -> None:
    import torch

    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("this host-dispatch extension has no CUDA, so it cannot enqueue into a CUDA graph")
    torch.cuda.current_stream().synchronize()


# ---- the process-wide default dispatcher ----

_default: HostDispatcher | None = None
_default_lock = threading.Lock()


def set_dispatch(mode: str, on_unsupported: str = "warn_once", **options: Any) -> HostDispatcher:
    """Make a new default dispatcher. Graphs captured under the old one keep working."""
    global _default
    dispatcher = HostDispatcher(mode, on_unsupported, **options)
    with _default_lock:
        _default = dispatcher
    return dispatcher


def default_dispatcher() -> HostDispatcher:
    global _default
    with _default_lock:
        if _default is None:
            _default = HostDispatcher("auto")
        return _default


def launch_hostfunc(fn: Callable[..., Any], *args: Any) -> None:
    """Enqueue ``fn(*args)`` on torch's current stream through the default dispatcher."""
    default_dispatcher().launch(fn, *args)


def hostfunc(fn: Callable[..., Any]) -> Callable[..., None]:
    """Calling the decorated function enqueues it (see `launch_hostfunc`); ``__wrapped__`` runs it now."""

    @functools.wraps(fn)
    def enqueue(*args: Any) -> None:
        default_dispatcher().launch(fn, *args)

    return enqueue


def dispatch_info() -> dict[str, Any]:
    """The default dispatcher's mode, active backend and why, and its counters."""
    return default_dispatcher().info()


def check() -> None:
    """Re-raise an exception kept from a callback of the default dispatcher."""
    with _default_lock:
        dispatcher = _default
    if dispatcher is not None:
        dispatcher.check()
