"""fastpath.compiler: a manifest -> a built, importable package, in four stages.

resolve(load_manifest(path)) -> Plan        every default filled, every gate decided
render(plan) -> {path: text}                deterministic
write_package(files, folder)                whole packages, write-if-different
build_package(folder, package)              scikit-build-core, cached build folder
native_llm(path)                            the manifest on the native engine (hooks read at run time)

The names load on first use, so `fastpath-compile --validate` imports neither Jinja nor the build.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_EXPORTS = {
    "BuildError": "build",
    "BuildResult": "build",
    "build_package": "build",
    "Decision": "plan",
    "HookPlan": "plan",
    "HookRef": "plan",
    "Plan": "plan",
    "RenderError": "render",
    "render": "render",
    "resolve": "resolve",
    "Drift": "write",
    "NotAGeneratedPackage": "write",
    "WriteResult": "write",
    "drift": "write",
    "write_package": "write",
    "native_llm": "native",
    "native_llm_from_text": "native",
}

__all__ = sorted(_EXPORTS)


class _Package(types.ModuleType):
    """`resolve` and `render` name both a function and the submodule that defines it. Importing a
    submodule binds it onto its package under its name, so once any module had imported
    `.resolve`, `from fastpath.compiler import resolve` gave the module. The function wins here."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
