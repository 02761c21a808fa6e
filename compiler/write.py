"""write: put rendered files on disk atomically, touching only what changed (FlashInfer JIT style).

- A file is written only when its bytes differ, so unchanged files keep their mtime and the
  cached build stays a no-op.
- New content is staged in a temporary folder beside the package, then renamed into place: a
  failure while writing leaves the package as it was.
- Files the package no longer has are removed, but only files the previous lock file lists as
  written by the compiler: build products and anything else are never touched.
- A folder that is not a generated package (it has no lock file) is never written into.
- The build folder is outside all of this.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BUILD_DIR = "build"
_SKIPPED_DIRS = {BUILD_DIR, "__pycache__"}


class NotAGeneratedPackage(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class WriteResult:
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Drift:
    path: str  # relative to the package folder
    kind: str  # "differs" | "missing" | "stale"


def lock_files(folder: Path) -> list[str] | None:
    """The files the compiler wrote into `folder`, as its lock file lists them; None without a lock."""
    for lock in folder.glob("*/manifest.lock.json"):
        try:
            data = json.loads(lock.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or "_generated" not in data:
            continue
        files = data.get("files", [])  # an older compiler's lock lists none: remove nothing
        if isinstance(files, list) and all(isinstance(f, str) for f in files):
            return files
    return None


def is_generated_package(folder: Path) -> bool:
    return lock_files(folder) is not None


def owned_files(folder: Path) -> set[str]:
    """Files under `folder` that the previous compile wrote (its lock file says which) and that are still there."""
    return {rel for rel in lock_files(folder) or () if (folder / rel).is_file()}


def _same(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def drift(files: Mapping[str, str], folder: Path) -> list[Drift]:
    """How the package on disk differs from `files`; empty when it is up to date."""
    result = []
    for rel, text in files.items():
        path = folder / rel
        if not path.is_file():
            result.append(Drift(rel, "missing"))
        elif not _same(path, text.encode("utf-8")):
            result.append(Drift(rel, "differs"))
    if folder.is_dir():
        result += [Drift(rel, "stale") for rel in sorted(owned_files(folder) - files.keys())]
    return result


def _check_target(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise NotAGeneratedPackage(f"{folder} exists and is not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not is_generated_package(folder):
        raise NotAGeneratedPackage(
            f"{folder} is not a generated package (it has no <package>/manifest.lock.json); "
            "refusing to write into it. Choose another -o, or remove the folder."
        )


def _check_paths(files: Mapping[str, str]) -> None:
    for rel in files:
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts or parts[0] == BUILD_DIR:
            raise ValueError(f"refusing to write {rel!r}: not a plain path inside the package")


def write_package(files: Mapping[str, str], folder: Path) -> WriteResult:
    """Make `folder` hold exactly `files` (plus what the compiler does not own)."""
    folder = Path(folder)
    _check_paths(files)
    _check_target(folder)
    data = {rel: text.encode("utf-8") for rel, text in files.items()}
    changed = [rel for rel, content in data.items() if not _same(folder / rel, content)]
    unchanged = tuple(rel for rel in data if rel not in changed)
    stale = sorted(owned_files(folder) - data.keys()) if folder.is_dir() else []
    if not changed and not stale:
        return WriteResult((), unchanged, ())

    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".staging", dir=folder.parent))
    try:
        for rel in changed:
            target = stage / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data[rel])
        if not folder.exists():
            stage.chmod(0o755)  # mkdtemp makes it private; a package folder is not
            stage.rename(folder)  # a new package appears whole, in one rename
            return WriteResult(tuple(changed), (), ())
        for rel in changed:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / rel, folder / rel)
        for rel in stale:
            (folder / rel).unlink()
            _remove_empty_parents(folder / rel, folder)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return WriteResult(tuple(changed), unchanged, tuple(stale))


def _remove_empty_parents(path: Path, root: Path) -> None:
    parent = path.parent
    while parent != root and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
