"""Runtime hooks: the engine fast paths a model opts into. Every hook is off unless declared.

Hooks change where and how the step loop moves data, never what a forward computes.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fastpath.vocab import EXECUTOR_EVENTS, LOCK_FILE

if TYPE_CHECKING:
    from .engine.executor import ExecutorCore
    from .runner.decode_inputs import DecodeInputs


@runtime_checkable
class DecodePrologue(Protocol):
    """Fills a decode step's inputs in one launch; returns False to decline (the native prologue runs)."""

    def __call__(self, executor: ExecutorCore, inputs: DecodeInputs) -> bool: ...


@runtime_checkable
class ExecutorEvents(Protocol):
    def after_warmup(self, executor: ExecutorCore) -> None: ...
    def before_overlap_loop(self, executor: ExecutorCore) -> None: ...
    def at_shutdown(self, executor: ExecutorCore) -> None: ...


EventFn = Callable[["ExecutorCore"], None]


@dataclass(frozen=True, slots=True)
class EventLists:
    """ExecutorEvents from lists of plain callables, as a manifest declares them."""

    after_warmup_fns: tuple[EventFn, ...] = ()
    before_overlap_loop_fns: tuple[EventFn, ...] = ()
    at_shutdown_fns: tuple[EventFn, ...] = ()

    def after_warmup(self, executor: ExecutorCore) -> None:
        _run_each(self.after_warmup_fns, executor, "after_warmup")

    def before_overlap_loop(self, executor: ExecutorCore) -> None:
        _run_each(self.before_overlap_loop_fns, executor, "before_overlap_loop")

    def at_shutdown(self, executor: ExecutorCore) -> None:
        _run_each(self.at_shutdown_fns, executor, "at_shutdown")


class HookError(RuntimeError):
    """A hook raised; the message names the hook, the event and, in a compiled package, the manifest line."""


def hook_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _declared_at(declared: object | None) -> str:
    site = str(declared) if declared is not None else ""
    return f" (declared at {site})" if site else ""


def call_hook(fn: EventFn, event: str, executor: ExecutorCore, declared: str | None = None) -> None:
    """Run one event hook; an error names the hook, the event and, from a compiled package, the manifest line."""
    try:
        fn(executor)
    except Exception as exc:
        raise HookError(
            f"executor_events.{event} hook {hook_name(fn)}{_declared_at(declared)} "
            f"raised {type(exc).__name__}: {exc}"
        ) from exc


def call_prologue(
    prologue: DecodePrologue, executor: ExecutorCore, inputs: DecodeInputs, declared: object | None = None
) -> bool:
    """Run the decode_prologue hook; an error names the hook (the step, and with it the engine, ends)."""
    try:
        return bool(prologue(executor, inputs))
    except HookError:
        raise
    except Exception as exc:
        raise HookError(
            f"decode_prologue hook {hook_name(prologue)}{_declared_at(declared)} "
            f"raised {type(exc).__name__}: {exc}"
        ) from exc


def _run_each(fns: Sequence[EventFn], executor: ExecutorCore, event: str) -> None:
    for fn in fns:
        call_hook(fn, event, executor)


def fire(events: ExecutorEvents, event: str, executor: ExecutorCore) -> None:
    """Call one event of an ExecutorEvents; an error names the hook that raised."""
    method = getattr(events, event)
    try:
        method(executor)
    except HookError:
        raise
    except Exception as exc:
        raise HookError(
            f"executor_events.{event} hook {hook_name(method)} raised {type(exc).__name__}: {exc}"
        ) from exc


@dataclass(frozen=True, slots=True)
class RuntimeHooks:
    loop_on_execution_stream: bool = False
    decode_prologue: DecodePrologue | None = None
    executor_events: ExecutorEvents | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.loop_on_execution_stream, bool):
            raise TypeError(
                f"RuntimeHooks.loop_on_execution_stream must be bool, got {type(self.loop_on_execution_stream).__name__}"
            )
        if self.decode_prologue is not None and not callable(self.decode_prologue):
            raise TypeError(
                f"RuntimeHooks.decode_prologue must be a DecodePrologue, got {type(self.decode_prologue).__name__}"
            )
        if self.executor_events is not None and not isinstance(self.executor_events, ExecutorEvents):
            raise TypeError(
                "RuntimeHooks.executor_events must implement after_warmup, before_overlap_loop and at_shutdown, "
                f"got {type(self.executor_events).__name__}"
            )

    @property
    def all_off(self) -> bool:
        return self == ALL_OFF


ALL_OFF = RuntimeHooks()


def runtime_hooks_of(model: Any) -> RuntimeHooks:
    """The hooks a model declares as a `runtime_hooks` class or instance attribute; all off when absent or None."""
    declared = getattr(model, "runtime_hooks", None)
    if declared is None:
        return ALL_OFF
    if not isinstance(declared, RuntimeHooks):
        raise TypeError(
            f"{type(model).__name__}.runtime_hooks must be a fastpath.runtime.RuntimeHooks or None, "
            f"got {type(declared).__name__}"
        )
    return declared


def import_path(path: str) -> Any:
    """'pkg.module:Name' -> the object."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"hook {path!r}: expected 'package.module:Name'")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def instantiate(obj: Any) -> Any:
    """A class declared as a hook is instantiated with no arguments; anything else is used as is."""
    return obj() if isinstance(obj, type) else obj


class HookSites:
    """Where a compiled package's manifest declares each hook ("path:line"), read from its lock.

    Kept in the lock, not in the executor's code, so a comment added to the manifest rewrites no
    code and keeps the package's version. Read on first use only, which is a failing hook's message:
    importing a package and running its steps never touch the file.
    """

    __slots__ = ("_lock", "_sites")

    def __init__(self, lock: Path) -> None:
        self._lock = lock
        self._sites: Mapping[str, Any] | None = None

    @classmethod
    def beside(cls, module_file: str) -> HookSites:
        return cls(Path(module_file).with_name(LOCK_FILE))

    def _read(self) -> Mapping[str, Any]:
        if self._sites is None:
            try:  # they only make messages better: an unreadable lock gives none
                sites = json.loads(self._lock.read_text(encoding="utf-8")).get("hook_sites")
            except (OSError, ValueError, AttributeError):
                sites = None
            self._sites = sites if isinstance(sites, dict) else {}
        return self._sites

    def of(self, hook: str, index: int | None = None) -> str | None:
        """The site of decode_prologue, or of an event's index-th callable."""
        sites = self._read()
        try:
            site = sites[hook] if index is None else sites["executor_events"][hook][index]
        except (KeyError, IndexError, TypeError):
            return None
        return site if isinstance(site, str) else None

    def site(self, hook: str) -> HookSite:
        """A hook's site, looked up only when printed: cheap to pass on every step."""
        return HookSite(self, hook)


@dataclass(frozen=True, slots=True)
class HookSite:
    sites: HookSites
    hook: str

    def __str__(self) -> str:
        return self.sites.of(self.hook) or ""


def hooks_from_lock(plan_hooks: Mapping[str, Any]) -> RuntimeHooks:
    """RuntimeHooks from a lock file's hooks section (import paths as 'module:attr' strings)."""
    prologue = plan_hooks.get("decode_prologue")
    events: Mapping[str, Sequence[str]] = plan_hooks.get("executor_events") or {}
    lists = {k: tuple(instantiate(import_path(p)) for p in events.get(k, ())) for k in _EVENT_KEYS}
    return RuntimeHooks(
        loop_on_execution_stream=bool(plan_hooks.get("loop_on_execution_stream", False)),
        decode_prologue=instantiate(import_path(prologue)) if prologue else None,
        executor_events=EventLists(*(lists[k] for k in _EVENT_KEYS)) if any(lists.values()) else None,
    )


_EVENT_KEYS = EXECUTOR_EVENTS
