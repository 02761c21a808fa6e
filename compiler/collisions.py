"""Names that cannot collide: a generated package never shadows or overwrites an existing module.

A manifest is refused when its import name already imports in the build environment (or in
the environment `--install --python` targets), unless what imports there is this compiler's own
earlier output of the same manifest name, and when two manifests of one run normalise to one
import name. The schema refuses the standard library and the build tools' names on its own.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from fastpath.schema.errors import Diagnostic
from fastpath.schema.loader import LoadedManifest

from . import probe_names
from .plan import Plan


def normalised(distribution: str) -> str:
    """PEP 503: runs of '-', '_' and '.' are one '-', case does not count."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _where(loaded: LoadedManifest) -> tuple[str, int, int]:
    line, column = loaded.document.values.get(("name",), (1, 1))
    return loaded.filename, line, column


def duplicates(units: Sequence[tuple[LoadedManifest, Plan]]) -> list[Diagnostic]:
    """Manifests of one run whose packages would land in one folder or one import name."""
    seen: dict[str, LoadedManifest] = {}
    problems = []
    for loaded, plan in units:
        first = seen.setdefault(plan.package, loaded)
        if first is not loaded:
            problems.append(
                Diagnostic(
                    *_where(loaded),
                    f"name {plan.name!r} makes the package {plan.package!r}, as {first.filename} "
                    f"(name {first.manifest.name!r}) does; give each manifest its own name",
                    "name",
                )
            )
    return problems


def probe(packages: list[str], python: str | None = None) -> dict[str, dict]:
    """probe_names.describe() in this interpreter, or in `python` when given."""
    if python is None:
        return probe_names.describe(packages)
    script = Path(probe_names.__file__)
    done = subprocess.run([python, "-I", str(script), *packages], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"cannot ask {python} which modules it has:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def taken(
    units: Sequence[tuple[LoadedManifest, Plan]], python: str | None = None, where: str = "here"
) -> list[Diagnostic]:
    """Manifests whose package name is already importable (`where` names the environment)."""
    found = probe([plan.package for _, plan in units], python)
    problems = []
    for loaded, plan in units:
        entry = found.get(plan.package)
        if entry is None or _own_output(entry, plan):
            continue
        problems.append(
            Diagnostic(
                *_where(loaded),
                f"name {plan.name!r} makes the package {plan.package!r}, which is already importable {where}: "
                f"{_owner(entry)}; a generated package would shadow or overwrite it, so choose another name",
                "name",
            )
        )
    return problems


def _own_output(entry: dict, plan: Plan) -> bool:
    """The compiler's earlier output of this manifest name: installed as its distribution, or its folder."""
    if any(normalised(d) == normalised(plan.distribution) for d in entry["distributions"]):
        return True
    return not entry["distributions"] and probe_names.generated_by_compiler(entry["folder"], plan.name)


def _owner(entry: dict) -> str:
    owners = entry["distributions"]
    if owners == ["the standard library"]:
        return "a module of the standard library"
    if owners:
        names = " and ".join(repr(d) for d in owners)
        return f"the distribution {names} installs it at {entry['origin']}"
    return f"the module at {entry['origin']}, which no installed distribution owns"
