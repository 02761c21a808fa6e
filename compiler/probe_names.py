"""Which top-level import names already exist in an environment, and who owns them.

Standard library only: the compiler imports it for its own interpreter, and runs it as a
script (`PY -I probe_names.py NAME...`, printing JSON) for the one `--install --python PY` targets.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def describe(names: list[str]) -> dict[str, dict]:
    """name -> {"origin", "folder", "distributions"} for each name that imports here; others are left out.

    A namespace package (a bare folder somewhere on sys.path) is left out too: any regular
    package of that name shadows it, so it cannot be what a generated package overwrites.
    """
    found = {}
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin in (None, "namespace"):
            continue
        locations = list(spec.submodule_search_locations or [])
        found[name] = {
            "origin": spec.origin,
            "folder": locations[0] if locations else None,
            "distributions": [],
        }
    if found:
        from importlib import metadata  # slow; only needed when something is found

        owners = metadata.packages_distributions()
        for name, entry in found.items():
            entry["distributions"] = sorted(set(owners.get(name, [])))
            if entry["origin"] in ("built-in", "frozen") or name in sys.stdlib_module_names:
                entry["distributions"] = ["the standard library"]
    return found


def generated_by_compiler(folder: str | None, manifest_name: str) -> bool:
    """Whether `folder` holds the compiler's own earlier output for the manifest `manifest_name`."""
    if folder is None:
        return False
    try:
        lock = json.loads((Path(folder) / "manifest.lock.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(lock, dict) and lock.get("name") == manifest_name and "_generated" in lock


if __name__ == "__main__":
    print(json.dumps(describe(sys.argv[1:])))
