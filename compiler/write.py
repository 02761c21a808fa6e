"""write: put a rendered package on disk whole or not at all (FlashInfer JIT's write-if-different).

- Under an exclusive lock on the output folder, the new package is assembled in a staging
  folder beside it and swapped in with one rename: concurrent or killed runs never leave a mix
  of two compiles. Leftovers of killed runs are cleaned by the next run.
- What the package keeps (unchanged files, the build folder, an in-place extension, anything the
  user put there) is hard-linked into the staging folder, so unchanged files keep their mtime and
  the cached build stays a no-op.
- A file the package no longer has is dropped only if the previous lock file lists it as written
  by the compiler; nothing else is ever removed.
- A folder that is not a generated package (it has no lock file) is never written into.
- Nothing is read or written through a symbolic link, and a FIFO, socket, device, folder or
  link where a generated file belongs is an error, not a hang.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .swap import exchange, output_lock

BUILD_DIR = "build"
STAGING_SUFFIX = ".staging"
OLD_SUFFIX = ".old"


class NotAGeneratedPackage(RuntimeError):
    """The compiler refuses to write here: a foreign folder, or something unsafe in the way."""


@dataclass(frozen=True, slots=True)
class WriteResult:
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]


STRAY = "not generated, and the wheel would ship it: remove it"


@dataclass(frozen=True, slots=True)
class Drift:
    path: str  # relative to the package folder
    kind: str  # "differs" | "missing" | "stale" | "not a regular file"


def lock_files(folder: Path) -> list[str] | None:
    """The files the compiler wrote into `folder`, as its lock file lists them; None without a lock."""
    if _kind(folder) != "dir":
        return None
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        lock = Path(entry.path) / "manifest.lock.json"
        if not entry.is_dir(follow_symlinks=False) or _kind(lock) != "file":
            continue
        try:
            data = json.loads(lock.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or "_generated" not in data:
            continue
        files = data.get("files", [])  # an older compiler's lock lists none: remove nothing
        if isinstance(files, list) and all(isinstance(f, str) for f in files):
            return [f for f in files if _is_plain(f)]
    return None


def owned_files(folder: Path) -> set[str]:
    """Files the previous compile wrote (its lock file says which) that are still there as regular files."""
    return {rel for rel in lock_files(folder) or () if _kind_in(folder, rel) == "file"}


def _kind(path: Path) -> str:
    """'missing', 'file', 'dir', 'symlink' or 'special' (FIFO, socket, device), never following a link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "special"


def _kind_in(folder: Path, rel: str) -> str:
    """_kind of folder/rel; a link or anything but a folder on the way counts as what blocks it."""
    path = folder
    *parents, name = Path(rel).parts
    for part in parents:
        path = path / part
        kind = _kind(path)
        if kind == "missing":
            return "missing"
        if kind != "dir":
            return f"{kind} on the way"
    return _kind(path / name)


def _same(folder: Path, rel: str, data: bytes) -> bool:
    if _kind_in(folder, rel) != "file":
        return False
    path = folder / rel
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def drift(files: Mapping[str, str], folder: Path) -> list[Drift]:
    """How the package on disk differs from `files`; empty when it is up to date."""
    folder = Path(folder)
    with output_lock(folder.parent, shared=True):
        result = []
        for rel, text in files.items():
            kind = _kind_in(folder, rel)
            if kind == "missing":
                result.append(Drift(rel, "missing"))
            elif kind != "file":
                result.append(Drift(rel, "not a regular file"))
            elif not _same(folder, rel, text.encode("utf-8")):
                result.append(Drift(rel, "differs"))
        result += [Drift(rel, "stale") for rel in sorted(owned_files(folder) - files.keys())]
        result += [Drift(rel, STRAY) for rel in _strays(folder, files)]
        return result


def strays(files: Mapping[str, str], folder: Path) -> list[str]:
    """Python files in the package that the compiler did not write, which its wheel would ship."""
    with output_lock(Path(folder).parent, shared=True):
        return _strays(Path(folder), files)


def _strays(folder: Path, files: Mapping[str, str]) -> list[str]:
    """Python files in the generated Python package that the compiler did not write (build outputs,
    caches and compiled extensions aside): the package's wheel takes its whole folder."""
    packages = {Path(rel).parent for rel in files if Path(rel).name == "__init__.py"}
    strays = []
    for package in packages:
        root = folder / package
        if not root.is_dir():
            continue
        for path in root.rglob("*.py"):
            rel = path.relative_to(folder).as_posix()
            if rel not in files and "__pycache__" not in path.parts:
                strays.append(rel)
    return sorted(strays)


def check_target(folder: Path, files: Mapping[str, str] | None = None) -> None:
    """Raise NotAGeneratedPackage unless the compiler may write `files` into `folder`."""
    kind = _kind(folder)
    if kind == "missing":
        return
    if kind != "dir":
        raise NotAGeneratedPackage(f"{folder} is a {kind}, not a folder; refusing to write there")
    if any(os.scandir(folder)) and lock_files(folder) is None:
        raise NotAGeneratedPackage(
            f"{folder} is not a generated package (it has no <package>/manifest.lock.json); "
            "refusing to write into it. Choose another -o, or remove the folder."
        )
    for rel in files or ():
        kind = _kind_in(folder, rel)
        if kind not in ("missing", "file"):
            what = {"dir": "folder", "symlink": "symbolic link"}.get(
                kind, "special file (FIFO, socket or device)"
            )
            raise NotAGeneratedPackage(
                f"{folder / rel}: a {what} stands where the compiler writes a file; it never writes "
                "through links or into special files. Remove it and compile again."
            )


def _is_plain(rel: str) -> bool:
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts and parts[0] != BUILD_DIR


def _check_paths(files: Mapping[str, str]) -> None:
    for rel in files:
        if not _is_plain(rel):
            raise ValueError(f"refusing to write {rel!r}: not a plain path inside the package")


def write_package(files: Mapping[str, str], folder: Path, extension: str | None = None) -> WriteResult:
    """Make `folder` hold exactly `files` (plus what the compiler does not own). `extension`: the
    package's in-place built module ("pkg/_hostdispatch"); when its sources (CMakeLists.txt, src/)
    change, its built file goes too, so an import cannot load a build of other sources."""
    folder = Path(folder)
    _check_paths(files)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(folder.parent):
        clean_leftovers(folder.parent)
        check_target(folder, files)
        data = {rel: text.encode("utf-8") for rel, text in files.items()}
        changed = [rel for rel, content in data.items() if not _same(folder, rel, content)]
        unchanged = tuple(rel for rel in data if rel not in changed)
        stale = sorted(owned_files(folder) - data.keys())
        if extension is not None and any(
            rel == "CMakeLists.txt" or rel.startswith("src/") for rel in changed
        ):
            stale += sorted(_built(folder, extension))
        if not changed and not stale:
            return WriteResult((), unchanged, ())
        _swap_in(folder, data, changed, {*changed, *stale})
    return WriteResult(tuple(changed), unchanged, tuple(stale))


def _built(folder: Path, extension: str) -> set[str]:
    """The in-place builds of `extension` ("pkg/_mod" -> pkg/_mod.<tag>.so or .pyd) in `folder`."""
    package, _, module = extension.rpartition("/")
    where = folder / package
    if _kind(where) != "dir":
        return set()
    return {
        f"{package}/{e.name}"
        for e in os.scandir(where)
        if e.name.startswith(module + ".")
        and e.name.endswith((".so", ".pyd"))
        and e.is_file(follow_symlinks=False)
    }


def _swap_in(folder: Path, data: dict[str, bytes], changed: list[str], dropped: set[str]) -> None:
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=STAGING_SUFFIX, dir=folder.parent))
    try:
        if folder.exists():
            stage.chmod(stat.S_IMODE(folder.stat().st_mode))
            _link_tree(folder, stage, dropped)
        else:
            stage.chmod(0o755)  # mkdtemp makes it private; a package folder is not
        for rel in changed:
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            write_file(stage / rel, data[rel])
        if folder.exists():
            exchange(stage, folder, old=stage.with_name(stage.name.removesuffix(STAGING_SUFFIX) + OLD_SUFFIX))
        else:
            stage.rename(folder)  # a new package appears whole, in one rename
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # after a swap, this is the old package


def write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)


def _link_tree(src: Path, dst: Path, dropped: set[str], rel: str = "") -> None:
    """Hard-link everything under `src` except `dropped` into `dst`, recreating folders and links."""
    for entry in _entries(src):
        name = f"{rel}{entry.name}"
        target = dst / entry.name
        if entry.is_dir(follow_symlinks=False):
            target.mkdir()
            target.chmod(stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))
            _link_tree(Path(entry.path), target, dropped, name + "/")
            if not any(target.iterdir()) and any(d.startswith(name + "/") for d in dropped):
                target.rmdir()  # it held only files the package no longer has
        elif entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)  # the link itself, never what it points at
        elif name not in dropped:
            try:
                os.link(entry.path, target, follow_symlinks=False)
            except OSError:  # a file system without hard links: copy, keeping the mtime
                shutil.copy2(entry.path, target, follow_symlinks=False)


def _entries(folder: Path) -> Iterator[os.DirEntry]:
    with os.scandir(folder) as it:
        yield from sorted(it, key=lambda e: e.name)


def clean_leftovers(out: Path) -> list[Path]:
    """Remove what killed runs left in `out` (call it under the output lock); returns what it removed.

    A staging folder is discarded. An old package whose swap was cut short before the new one
    took its place is put back, so the folder holds one whole compile, never a mix.
    """
    cleaned = []
    for entry in _entries(out):
        path = Path(entry.path)
        if not entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.name.endswith(STAGING_SUFFIX):
            shutil.rmtree(path, ignore_errors=True)
            cleaned.append(path)
        elif entry.name.endswith(OLD_SUFFIX):
            package = out / entry.name[1:].rsplit(".", 2)[0]
            if _kind(package) == "missing":
                path.rename(package)
            else:
                shutil.rmtree(path, ignore_errors=True)
            cleaned.append(path)
    return cleaned
