"""render: Plan + templates -> {relative path: text}. Deterministic: the same Plan, the same bytes.

One Jinja environment: StrictUndefined (a missing name is an error, not an empty string),
autoescape off (the outputs are code, not HTML), trim_blocks and lstrip_blocks (block tags
leave no blank lines), keep_trailing_newline. `finalize` refuses to paste a value that is
neither an identifier nor compiler-built code; other values go through the `py` filter.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from fastpath.vocab import LOCK_FILE

from . import distribution
from .context import contexts
from .header import generated_line, has_marker
from .literals import Code, py_literal
from .plan import Plan

# compiler/ and templates/ are siblings both in a checkout and in an installed fastpath.
TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
# What a template may paste as is: identifiers, dotted module paths, digits.
_PASTABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*|[0-9]+")


class RenderError(RuntimeError):
    pass


def _finalize(value: Any) -> Any:
    # An Undefined passes through so that StrictUndefined raises its own, clearer error.
    if isinstance(value, Code | int | jinja2.Undefined) or (
        isinstance(value, str) and _PASTABLE.fullmatch(value)
    ):
        return value
    raise RenderError(f"a template pasted {value!r} as code; pass it through the `py` filter")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )
    env.filters["py"] = py_literal
    return env


def output_paths(plan: Plan) -> dict[str, str]:
    """template name -> the path it renders to, inside the package folder."""
    return {
        "pyproject.toml.j2": "pyproject.toml",
        "CMakeLists.txt.j2": "CMakeLists.txt",
        "hostdispatch.cpp.j2": "src/hostdispatch.cpp",
        "__init__.py.j2": f"{plan.package}/__init__.py",
        "__main__.py.j2": f"{plan.package}/__main__.py",
        "executor.py.j2": f"{plan.package}/executor.py",
    }


def render(plan: Plan) -> dict[str, str]:
    """Every file of the generated package, by its path relative to the package folder."""
    env = environment()
    paths = output_paths(plan)
    templates = contexts(plan)
    pyproject = templates.pop("pyproject.toml.j2")
    files = {paths[template]: _render(env, template, ctx) for template, ctx in templates.items()}
    pyproject["version"] = package_version(plan, files)
    files[lock_path(plan)] = lock_json(plan, [*files, paths["pyproject.toml.j2"], lock_path(plan)])
    files[paths["pyproject.toml.j2"]] = _render(env, "pyproject.toml.j2", pyproject)
    for path, text in files.items():
        if not has_marker(text):
            raise RenderError(f"{path} does not start with the @generated marker; its template must emit it")
    return dict(sorted(files.items()))


def _render(env: jinja2.Environment, template: str, ctx: dict[str, Any]) -> str:
    try:
        return env.get_template(template).render(ctx)
    except jinja2.TemplateNotFound:
        raise RenderError(f"template {template} is missing from {TEMPLATES_DIR}") from None


def lock_path(plan: Plan) -> str:
    return f"{plan.package}/{LOCK_FILE}"


def package_version(plan: Plan, files: dict[str, str]) -> str:
    """fastpath's version, then a digest of what the package does: its code, its LLM defaults, and the
    rest of what the lock tells the package at run time (its serve defaults: port, API key variable).

    The files that hold the manifest's hash (__init__.py, the lock) are left out, and so are the lock's
    manifest path, hash and hook line numbers, so a comment added to the manifest keeps the version
    and pyproject.toml unchanged; any change of behaviour gives a new version, which pip installs.
    """
    behaviour = {k: v for k, v in plan.to_json().items() if k not in ("manifest", "hook_sites", "decisions")}
    digest = hashlib.sha256(json.dumps(behaviour, sort_keys=True).encode())
    volatile = {f"{plan.package}/__init__.py", lock_path(plan)}
    for path in sorted(set(files) - volatile):
        digest.update(f"\0{path}\0{files[path]}".encode())
    return f"{distribution.version()}+{digest.hexdigest()[:12]}"


def lock_json(plan: Plan, files: Sequence[str] = ()) -> str:
    """The Plan as manifest.lock.json: sorted keys, two-space indent, the marker as its first key.

    `files` lists every file the compiler writes into the package; the next compile removes
    only those (never a file the user or a build put there).
    """
    data = {"_generated": generated_line("compiler/plan.py"), **plan.to_json(), "files": sorted(files)}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
