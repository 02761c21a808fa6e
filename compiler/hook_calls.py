"""Whether a hook's definition takes the call the executor makes, read from its source.

A decode_prologue is called as `hook(executor, inputs)`, an executor event as `hook(executor)`; a class
declared as either is first instantiated with no arguments (runtime/hooks.instantiate), and its
instance called. A top-level `def` or `class` whose
parameters cannot take that call fails when the package starts; this says so at compile time. Where
the source cannot tell (no Python source, a decorator, a name bound otherwise, a class with bases and
no `__call__` of its own), the definition is taken on trust, as hook_lookup takes names.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass

from . import hook_lookup


@dataclass(frozen=True, slots=True)
class HookCall:
    """How the executor calls a hook (a class's instance, made with no arguments): its arguments."""

    args: tuple[str, ...]


PROLOGUE = HookCall(("executor", "inputs"))
EVENT = HookCall(("executor",))


def problem(module: str, attr: str, call: HookCall) -> str | None:
    """Why `module:attr` cannot take `call`, when its source shows it; else None."""
    node = _definition(module, attr)
    if node is None or node.decorator_list:
        return None
    if isinstance(node, ast.ClassDef):
        return _class_problem(node, call)
    return _takes(node.args, call.args, skip=0)


def _definition(module: str, attr: str) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None:
    """The one top-level def or class that binds `attr`, where nothing else at the top level does."""
    loaded = sys.modules.get(module)
    spec = getattr(loaded, "__spec__", None) if loaded is not None else hook_lookup.find(module)
    tree = hook_lookup.parsed(spec) if spec is not None else None
    if tree is None:
        return None
    found = [n for n in tree.body if getattr(n, "name", None) == attr]
    bound: set[str] = set()
    hook_lookup.bind([n for n in tree.body if getattr(n, "name", None) != attr], bound)
    if len(found) != 1 or attr in bound:
        return None
    (node,) = found
    return node if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else None


def _class_problem(node: ast.ClassDef, call: HookCall) -> str | None:
    methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)}
    init = methods.get("__init__")
    if init is not None and init.decorator_list:
        init = None
    if init is not None and _takes(init.args, (), skip=1) is not None:
        return "is a class the executor makes with no arguments, but its __init__ needs some"
    method = methods.get("__call__")
    if method is None:
        return (
            None
            if node.bases
            else f"is a class without __call__, and its instance is called ({_listed(call.args)})"
        )
    return None if method.decorator_list else _takes(method.args, call.args, skip=1)


def _takes(args: ast.arguments, given: tuple[str, ...], skip: int) -> str | None:
    """Why parameters `args` (less the first `skip`, self) cannot take the positional `given`."""
    positional = [*args.posonlyargs, *args.args]
    if len(positional) < skip:
        return None  # self comes through *args: nothing to read
    required = max(0, len(positional) - len(args.defaults) - skip)
    most = None if args.vararg is not None else len(positional) - skip
    keywords = [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    if keywords:
        return f"needs keyword-only {', '.join(keywords)}, which the call ({_listed(given)}) never passes"
    n = len(given)
    if n < required or (most is not None and n > most):
        span = (
            str(required)
            if most == required
            else f"{required} or more"
            if most is None
            else f"{required} to {most}"
        )
        plural = "" if span == "1" else "s"
        return f"takes {span} positional argument{plural}, but is called with {n} ({_listed(given)})"
    return None


def _listed(args: tuple[str, ...]) -> str:
    return ", ".join(args)
