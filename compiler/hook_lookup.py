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
import sys
from importlib.machinery import ModuleSpec, PathFinder

from fastpath.schema.suggest import did_you_mean

OWN = "fastpath"


def problem(module: str, attr: str) -> str | None:
    """Why `module:attr` will not import where the package runs, when that shows already here; else None."""
    loaded = sys.modules.get(module)
    if loaded is not None:  # already imported by this process: ask it
        if hasattr(loaded, attr):
            return None
        return f"{module} has no {attr!r}" + did_you_mean(attr, _public(dir(loaded)))
    spec = _find(module)
    if spec is None:
        own = module == OWN or module.startswith(OWN + ".")
        return f"fastpath has no module {module!r}" if own else None
    names = _defined(spec)
    if names is None or attr in names or _is_submodule(spec, attr):
        return None
    return f"{module} defines no {attr!r}" + did_you_mean(attr, _public(names))


def _find(module: str) -> ModuleSpec | None:
    """The module's spec, its parents walked without running any of them (a parent already imported
    lends its __path__)."""
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
                spec = (
                    importlib.util.find_spec(name) if name not in sys.modules else sys.modules[name].__spec__
                )
            elif locations is None:
                return None  # a module, not a package: it has no submodules to find
            else:
                spec = PathFinder.find_spec(name, list(locations))
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
    return spec


def _defined(spec: ModuleSpec) -> set[str] | None:
    """Names bound at the module's top level, or None where its source cannot tell."""
    if not spec.has_location or not (spec.origin or "").endswith(".py"):
        return None
    try:
        with open(spec.origin, "rb") as f:
            tree = ast.parse(f.read(), spec.origin)
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    if not _bind(tree.body, names):
        return None
    return names


def _bind(body: list[ast.stmt], names: set[str]) -> bool:
    """Add the names `body` binds to `names`; False where a star import or a module __getattr__ makes
    that unknowable."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == "__getattr__":
                return False
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return False
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            blocks = [getattr(node, f, []) for f in ("body", "orelse", "finalbody")]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            if not all(_bind(block, names) for block in blocks):
                return False
    return True


def _is_submodule(spec: ModuleSpec, attr: str) -> bool:
    locations = spec.submodule_search_locations
    return locations is not None and PathFinder.find_spec(f"{spec.name}.{attr}", list(locations)) is not None


def _public(names) -> list[str]:
    return [n for n in names if not n.startswith("_")]
