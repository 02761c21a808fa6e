"""A hook's `module:Name` looked up where it is compiled, without importing anything.

The module is found on the path as the import system would find it, its source parsed, and the name
looked for among what the module defines at its top level. A module that is not found here is left
to the package's import where it runs (it may be installed only there), except fastpath's own, which
is always here. Where the source cannot tell (no Python source, a star import, a module
`__getattr__`), the name is taken on trust.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from importlib.machinery import ModuleSpec, PathFinder

from fastpath.schema.suggest import did_you_mean

OWN = "fastpath"


def problem(module: str, attr: str) -> str | None:
    """Why `module:attr` will not import where the package runs, when that shows already here; else None."""
    if module in sys.modules:  # already imported by this process (or blocked): ask it
        loaded = sys.modules[module]
        if loaded is None or hasattr(loaded, attr) or _find_submodule(loaded, attr):
            return None
        return f"{module} has no {attr!r}" + did_you_mean(attr, _public(dir(loaded)))
    spec = find(module)
    if spec is None:
        own = module == OWN or module.startswith(OWN + ".")
        return f"fastpath has no module {module!r}" if own else None
    names = _defined(spec)
    if names is None or attr in names or _is_submodule(spec, attr):
        return None
    return f"{module} has no {attr!r}" + did_you_mean(attr, _public(names))


def unseen(module: str) -> bool:
    """Whether the module is not findable here, so that its hooks are checked only where the package
    runs (problem() says nothing of them)."""
    own = module == OWN or module.startswith(OWN + ".")
    return not own and module not in sys.modules and find(module) is None


def find(module: str) -> ModuleSpec | None:
    """The module's spec, from sys.path or the working directory, its parents walked without running
    any of them (a parent already imported lends its __path__)."""
    parts = module.split(".")
    spec = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        parent = sys.modules.get(".".join(parts[:i])) if i else None
        if parent is not None:
            locations = getattr(parent, "__path__", None)
        else:
            locations = spec.submodule_search_locations if spec is not None else None
        try:
            if i == 0:
                top = sys.modules.get(name, ...)  # None: an import blocked on purpose
                spec = importlib.util.find_spec(name) if top is ... else getattr(top, "__spec__", None)
                if spec is None and top is ...:  # `python -m pkg` in this folder would import it from here
                    spec = PathFinder.find_spec(name, [os.getcwd()])
            elif locations is None:
                return None  # a module, not a package: it has no submodules to find
            else:
                spec = PathFinder.find_spec(name, list(locations))
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
    return spec


# Calls through which a module can bind names its statements do not show.
_DYNAMIC = {"globals", "vars", "setattr", "exec", "eval", "__import__", "import_module"}


def _defined(spec: ModuleSpec) -> set[str] | None:
    """Names bound at the module's top level, or None where its source cannot tell: no Python source,
    a star import, a module __getattr__, or names bound dynamically (globals(), setattr, exec,
    sys.modules)."""
    tree = parsed(spec)
    if tree is None:
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, ast.Call) and _callee(node.func) in _DYNAMIC:
            return None
        if isinstance(node, ast.Attribute) and node.attr == "modules" and _callee(node.value) == "sys":
            return None  # sys.modules[__name__] = ... swaps the module
        if isinstance(node, ast.Global):
            names.update(node.names)  # a function that binds a module name when it runs
    bind(tree.body, names)
    return None if "__getattr__" in names else names


def parsed(spec: ModuleSpec) -> ast.Module | None:
    """The module's Python source, parsed; None where there is none, or it does not parse."""
    if not spec.has_location or not (spec.origin or "").endswith(".py"):
        return None
    try:
        with open(spec.origin, "rb") as f:
            return ast.parse(f.read(), spec.origin)
    except (OSError, SyntaxError, ValueError):
        return None


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def bind(body: list[ast.stmt], names: set[str]) -> None:
    """Add the names a module's top-level statements bind, in any branch, to `names`."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
            continue
        nested = _blocks(node)
        inner = {id(stmt) for block in nested for stmt in block}
        # Assignments, for and with targets, walrus, match captures, except names: every name stored
        # by this statement outside the statements nested in it (those are walked as a body below).
        stack = [node]
        while stack:
            child = stack.pop()
            if child is not node and id(child) in inner:
                continue
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
            elif isinstance(child, ast.MatchAs | ast.MatchStar) and child.name:
                names.add(child.name)
            elif isinstance(child, ast.MatchMapping) and child.rest:
                names.add(child.rest)
            elif isinstance(child, ast.ExceptHandler) and child.name:
                names.add(child.name)
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                stack.extend(ast.iter_child_nodes(child))
        for block in nested:
            bind(block, names)


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested in a compound statement (if, try, with, for, while, match)."""
    blocks = [getattr(node, f, None) for f in ("body", "orelse", "finalbody")]
    blocks += [h.body for h in getattr(node, "handlers", [])]
    blocks += [case.body for case in getattr(node, "cases", [])]
    return [b for b in blocks if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]


def _is_submodule(spec: ModuleSpec, attr: str) -> bool:
    locations = spec.submodule_search_locations
    return locations is not None and PathFinder.find_spec(f"{spec.name}.{attr}", list(locations)) is not None


def _find_submodule(module: object, attr: str) -> bool:
    """Whether an imported package has a submodule `attr` not yet imported."""
    spec = getattr(module, "__spec__", None)
    return spec is not None and _is_submodule(spec, attr)


def _public(names) -> list[str]:
    return [n for n in names if not n.startswith("_")]
