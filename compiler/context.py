"""What each template sees: plain, validated data built from the Plan (torchgen's emitters).

Templates get identifiers and enum values, which they may paste, and everything else as data
to pass through the `py` filter (a Python literal). The render environment refuses to paste
any other string, so a template cannot put a manifest's free text into code by mistake.

Template contexts:
- every template: `generated_header` (a full one-line comment in the file's comment syntax),
  `package` (the import name), `name` (the manifest name; may hold '-', so data only).
- pyproject.toml.j2: `distribution`, `version`.
- CMakeLists.txt.j2: `module_name`.
- hostdispatch.cpp.j2: `module_name` ("_hostdispatch"), `dispatch_mode` ("blocking" | "spin" |
  "auto"), `on_unsupported` ("warn_once" | "error").
- __init__.py.j2: `defaults` (the LLM keyword arguments), `manifest_sha256`, `module_name`.
- __main__.py.j2: the common names only; `python -m <pkg> serve` reads its defaults from MANIFEST
  at run time, so no manifest value is pasted there.
- executor.py.j2: `extension_module` (data), and `hooks`, a HookContext: declared hooks only, each import
  split into validated identifiers. The hooks are compiled into the executor, so __init__
  passes none at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .header import comment
from .plan import HookRef, Plan

MODULE_NAME = "_hostdispatch"


@dataclass(frozen=True, slots=True)
class HookImport:
    """`from {module} import {attr} as {local}`; all three are validated identifiers."""

    module: str
    attr: str
    local: str
    path: str  # "module:attr", for messages (pass through `py`)


@dataclass(frozen=True, slots=True)
class HookContext:
    loop_on_execution_stream: bool
    decode_prologue: HookImport | None
    # event -> its callables; only events the manifest declares appear here
    executor_events: dict[str, tuple[HookImport, ...]]
    imports: tuple[HookImport, ...]  # every declared callable once, in declaration order
    # `from {module} import {names}` lines of the executor, sorted as isort sorts them
    import_lines: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (module, ((name, local), ...))


# Names the executor template defines or imports itself; a hook's local name avoids them.
_TEMPLATE_NAMES = {
    "Executor",
    "ExecutorCore",
    "Iterator",
    "StepRecord",
    "call_hook",
    "hook",
    "instantiate",
    "inputs",
}


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's isort, order-by-type: CONSTANTS, then Classes, then functions and variables
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name.lower()


def _import_lines(plan_hooks, imports: tuple[HookImport, ...]):
    core = {("ExecutorCore", "ExecutorCore")}
    if plan_hooks.loop_on_execution_stream or plan_hooks.before_overlap_loop:
        core.add(("StepRecord", "StepRecord"))  # steps() is overridden
    lines: dict[str, set[tuple[str, str]]] = {"fastpath.runtime.engine.executor": core}
    if imports:
        helpers = lines.setdefault("fastpath.runtime.hooks", set())
        helpers.add(("instantiate", "instantiate"))
        if any(plan_hooks.executor_events().values()):
            helpers.add(("call_hook", "call_hook"))
    for imp in imports:
        lines.setdefault(imp.module, set()).add((imp.attr, imp.local))
    # Sections as isort writes them: other packages' hooks, then fastpath's own modules.
    ordered = sorted(lines.items(), key=lambda kv: (kv[0].split(".")[0] == "fastpath", kv[0]))
    return tuple((module, tuple(sorted(names, key=lambda n: _isort_key(n[0])))) for module, names in ordered)


def hook_context(plan: Plan) -> HookContext:
    by_path: dict[str, HookImport] = {}
    taken: set[str] = set(_TEMPLATE_NAMES)

    def import_of(ref: HookRef) -> HookImport:
        if ref.path not in by_path:
            local, n = ref.attr, 1
            while local in taken:  # two hooks with one attribute name, from different modules
                n += 1
                local = f"{ref.attr}_{n}"
            taken.add(local)
            by_path[ref.path] = HookImport(ref.module, ref.attr, local, ref.path)
        return by_path[ref.path]

    hooks = plan.hooks
    prologue = import_of(hooks.decode_prologue) if hooks.decode_prologue else None
    events = {event: tuple(map(import_of, refs)) for event, refs in hooks.executor_events().items() if refs}
    imports = tuple(by_path.values())
    return HookContext(
        hooks.loop_on_execution_stream, prologue, events, imports, _import_lines(hooks, imports)
    )


def contexts(plan: Plan) -> dict[str, dict[str, Any]]:
    """template name -> its context."""
    common = {"package": plan.package, "name": plan.name}
    python = {**common, "generated_header": comment("#", plan)}
    return {
        "pyproject.toml.j2": {
            **python,
            "distribution": plan.distribution,
            # The manifest's hash as a local version: an installed package says what it was built from.
            "version": f"0.0.0+{plan.manifest_sha256[:12]}",
        },
        "CMakeLists.txt.j2": {**python, "module_name": MODULE_NAME},
        "hostdispatch.cpp.j2": {
            **common,
            "generated_header": comment("//", plan),
            "module_name": MODULE_NAME,
            "dispatch_mode": plan.dispatch_mode,
            "on_unsupported": plan.on_unsupported,
        },
        "__init__.py.j2": {
            **python,
            "defaults": plan.package_defaults(),
            "manifest_sha256": plan.manifest_sha256,
            "module_name": MODULE_NAME,
        },
        "__main__.py.j2": python,
        "executor.py.j2": {
            **python,
            "hooks": hook_context(plan),
            "extension_module": f"{plan.package}.{MODULE_NAME}",
        },
    }
