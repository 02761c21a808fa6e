"""What each template sees: plain, validated data built from the Plan (torchgen's emitters).

Templates get identifiers and enum values, which they may paste, and everything else as data
to pass through the `py` filter (a Python literal). The render environment refuses to paste
any other string, so a template cannot put a manifest's free text into code by mistake.

Each template sees only what it renders, so a file's bytes change only when that part of the
manifest does: the manifest's hash reaches __init__.py alone.

Template contexts:
- every template: `generated_header` (a full one-line comment in the file's comment syntax,
  naming the template), `package` (the import name).
- pyproject.toml.j2: `distribution`, `version`, `fastpath_requirement` (fastpath's
  distribution pinned, e.g. "fastpath-llm==0.1.0", for build-system.requires) and
  `fastpath_dependency` (the same with the extras the manifest needs, for dependencies).
- CMakeLists.txt.j2: `module_name`.
- hostdispatch.cpp.j2: `module_name` ("_hostdispatch"), `mode_enum` and `on_unsupported_enum` (C++
  enumerators of dispatch_names.hpp, from fastpath.vocab), `guided_fill` (compile guided fill in).
- __init__.py.j2: `defaults` (the LLM keyword arguments but the dispatch mode, which the extension
  fixes), `manifest_sha256`, `module_name`.
- __main__.py.j2: the common names only; `python -m <pkg> serve` reads its defaults from MANIFEST
  at run time, so no manifest value is pasted there.
- executor.py.j2: `extension_module` (data), and `hooks`, a HookContext: declared hooks only, each import
  split into validated identifiers. The hooks are compiled into the executor, so __init__
  passes none at run time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from fastpath.vocab import CATALOG_EXTRA, CATALOG_MODELS

from . import distribution
from .distribution import GUIDED_EXTRA, SERVE_EXTRA
from .header import comment
from .literals import Code
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
    import_block: Code  # the executor's import statements, as ruff's isort and format leave them
    event_assignments: tuple[Code, ...]  # `_<event> = (instantiate(hook_1), ...)`, one per declared event


# A hook is imported as `hook_<n>`, numbered in declaration order. No name the template defines
# or imports (Executor, ExecutorCore, Iterator, HookSites, call_hook, instantiate, _sites,
# _decode_prologue, _decode_prologue_site, _after_warmup, the loop variables `index` and `hook`,
# builtins such as super) has that form, so no hook can shadow one, and the lines that use hooks stay short whatever the hooks are called.
HOOK_PREFIX = "hook_"
LINE_LENGTH = 110  # pyproject.toml's [tool.ruff] line-length


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's isort, order-by-type: CONSTANTS, then Classes, then functions and variables
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name.lower()


def _from_import(module: str, names: list[str]) -> str:
    """One `from module import names` statement, exploded the way ruff format does past the line length."""
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= LINE_LENGTH:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"


def _tuple_assignment(name: str, items: list[str]) -> Code:
    """`name = (a, b)`, or one item a line past the line length, as ruff format writes it."""
    line = f"{name} = ({', '.join(items)}{',' if len(items) == 1 else ''})"
    if len(line) <= LINE_LENGTH:
        return Code(line)
    return Code(f"{name} = (\n" + "".join(f"    {item},\n" for item in items) + ")")


def _section(module: str) -> int:
    top = module.split(".")[0]
    return 0 if top in sys.stdlib_module_names else 2 if top == "fastpath" else 1


def _import_block(plan_hooks, imports: tuple[HookImport, ...]) -> Code:
    """ruff's isort: stdlib, third-party, fastpath; modules in order; an aliased name on its own line."""
    plain: dict[str, set[str]] = {"fastpath.runtime.engine.executor": {"ExecutorCore"}}
    if plan_hooks.loop_on_execution_stream or plan_hooks.before_overlap_loop:
        plain["collections.abc"] = {"Iterator"}  # steps() is overridden
        plain["fastpath.runtime.engine.executor"].add("StepRecord")
    if imports:
        plain["fastpath.runtime.hooks"] = {"instantiate"}
        if any(plan_hooks.executor_events().values()):
            plain["fastpath.runtime.hooks"].add("call_hook")
        if plan_hooks.decode_prologue:
            plain["fastpath.runtime.hooks"].add("call_prologue")
        plain["fastpath.runtime.hooks"].add("HookSites")
    statements = []  # (section, module, first name's key, aliased, text)
    for module, names in plain.items():
        ordered = sorted(names, key=_isort_key)
        statements.append((_section(module), module.lower(), _isort_key(ordered[0]), 0, module, ordered))
    for imp in imports:
        alias = f"{imp.attr} as {imp.local}"
        statements.append(
            (_section(imp.module), imp.module.lower(), _isort_key(imp.attr), 1, imp.module, [alias])
        )
    lines: list[str] = []
    previous = None
    for section, *_, module, names in sorted(statements, key=lambda s: s[:5]):
        if previous is not None and section != previous:
            lines.append("")
        lines.append(_from_import(module, names))
        previous = section
    return Code("\n".join(lines) + "\n")


def hook_context(plan: Plan) -> HookContext:
    by_path: dict[str, HookImport] = {}

    def import_of(ref: HookRef) -> HookImport:
        if ref.path not in by_path:
            local = f"{HOOK_PREFIX}{len(by_path) + 1}"
            by_path[ref.path] = HookImport(ref.module, ref.attr, local, ref.path)
        return by_path[ref.path]

    hooks = plan.hooks
    prologue = import_of(hooks.decode_prologue) if hooks.decode_prologue else None
    events = {event: tuple(map(import_of, refs)) for event, refs in hooks.executor_events().items() if refs}
    imports = tuple(by_path.values())
    assignments = tuple(
        _tuple_assignment(f"_{event}", [f"instantiate({imp.local})" for imp in imps])
        for event, imps in events.items()
    )
    return HookContext(
        hooks.loop_on_execution_stream, prologue, events, imports, _import_block(hooks, imports), assignments
    )


def _header(prefix: str, template: str) -> Code:
    return comment(prefix, f"templates/{template}")


def enumerator(name: str) -> str:
    """The C++ enumerator of a vocabulary name, as dispatch_names.hpp declares it: "warn_once" -> "WarnOnce"."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def hostdispatch_context(dispatch_mode: str, on_unsupported: str, guided_fill: bool) -> dict[str, Any]:
    """hostdispatch.cpp.j2's own names (tests/cpp renders the template with them too)."""
    return {
        "module_name": MODULE_NAME,
        "mode_enum": enumerator(dispatch_mode),
        "on_unsupported_enum": enumerator(on_unsupported),
        "guided_fill": guided_fill,
    }


def contexts(plan: Plan) -> dict[str, dict[str, Any]]:
    """template name -> its context. The pyproject's `version` is filled in by render()."""
    common = {"package": plan.package}
    extras = (GUIDED_EXTRA,) if plan.guided_backend != "none" else ()
    if plan.model in CATALOG_MODELS:  # converted on first use, which needs the conversion extra
        extras = (*extras, CATALOG_EXTRA)
    return {
        "pyproject.toml.j2": {
            **common,
            "generated_header": _header("#", "pyproject.toml.j2"),
            "distribution": plan.distribution,
            "fastpath_requirement": distribution.requirement(),
            "fastpath_dependency": distribution.requirement(extras),
            "fastpath_serve_dependency": distribution.requirement((*extras, SERVE_EXTRA)),
        },
        "CMakeLists.txt.j2": {
            **common,
            "generated_header": _header("#", "CMakeLists.txt.j2"),
            "module_name": MODULE_NAME,
        },
        "hostdispatch.cpp.j2": {
            **common,
            "generated_header": _header("//", "hostdispatch.cpp.j2"),
            **hostdispatch_context(plan.dispatch_mode, plan.on_unsupported, plan.guided_backend != "none"),
        },
        "__init__.py.j2": {
            **common,
            "generated_header": _header("#", "__init__.py.j2"),
            "defaults": plan.package_defaults(),
            "manifest_sha256": plan.manifest_sha256,
            "module_name": MODULE_NAME,
        },
        "__main__.py.j2": {**common, "generated_header": _header("#", "__main__.py.j2")},
        "executor.py.j2": {
            **common,
            "generated_header": _header("#", "executor.py.j2"),
            "hooks": hook_context(plan),
            "extension_module": f"{plan.package}.{MODULE_NAME}",
        },
    }
