"""fastpath.schema: what a manifest may say.

The names below load on first use, so `fastpath.schema.names` (plain constants) imports without
pydantic; the runtime relies on that.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

_EXPORTS = {
    "Manifest": "models",
    "LoadedManifest": "loader",
    "load_manifest": "loader",
    "parse_manifest": "loader",
    "Diagnostic": "errors",
    "FieldError": "errors",
    "ManifestError": "errors",
    "split_import_path": "fieldtypes",
    "python_package": "fieldtypes",
    "DEFAULT_FMHA_ORDER": "names",
    "EXECUTOR_EVENTS": "names",
    "FMHA_LIBRARIES": "names",
    "RANDOM_PRESETS": "names",
    "SCHEMA_VERSION": "names",
}

__all__ = sorted([*_EXPORTS, "json_schema_path"])


def json_schema_path() -> Path:
    """The JSON Schema of manifests this fastpath reads, shipped with it: for editors and check-jsonschema."""
    return Path(__file__).resolve().with_name("manifest.schema.json")


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
