"""fastpath's own distribution: its name on the package index and the version generated packages pin.

The import name is `fastpath`, but the index's `fastpath` is an unrelated project, so the
distribution is `fastpath-llm`. The version is read from the installed distribution's metadata,
falling back to the checkout's pyproject.toml: it is written down once, there.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from fastpath.vocab import DISTRIBUTION

# The extra a manifest with guided decoding needs (xgrammar), as pyproject.toml declares it.
GUIDED_EXTRA = "guided"
SERVE_EXTRA = "serve"  # fastpath's HTTP server (`python -m <package> serve`)
# compiler/ sits in the checkout's root, beside pyproject.toml; an installed wheel has no pyproject.
SOURCE_ROOT = Path(__file__).resolve().parent.parent


def source_tree() -> Path | None:
    """The checkout fastpath runs from (an editable install), or None for an installed wheel."""
    pyproject = SOURCE_ROOT / "pyproject.toml"
    if pyproject.is_file() and _pyproject_field(pyproject, "name") == DISTRIBUTION:
        return SOURCE_ROOT
    return None


@cache
def version() -> str:
    import importlib.metadata  # slow to import; only packaging needs it

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        root = source_tree()
        found = root and _pyproject_field(root / "pyproject.toml", "version")
        if not found:
            raise RuntimeError(
                f"cannot tell fastpath's version: {DISTRIBUTION} is not installed and "
                f"{SOURCE_ROOT / 'pyproject.toml'} does not name it"
            ) from None
        return found


def requirement(extras: tuple[str, ...] = ()) -> str:
    """The pinned requirement on fastpath, e.g. 'fastpath-llm[guided]==0.1.0'."""
    return f"{DISTRIBUTION}{'[' + ','.join(extras) + ']' if extras else ''}=={version()}"


def _pyproject_field(pyproject: Path, field: str) -> str | None:
    # `name = "..."` and `version = "..."` in [project]; tomllib is not in Python 3.10.
    text = pyproject.read_text(encoding="utf-8")
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = project and re.search(rf'^{field}\s*=\s*"([^"]+)"', project.group(1), re.M)
    return found.group(1) if found else None
