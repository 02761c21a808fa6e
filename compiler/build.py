"""build: scikit-build-core builds a generated package's wheel, and its extension lands in place.

The CMake build folder is `<package>/build/<wheel tag>` and is kept, so rebuilding an
unchanged package reconfigures from cache and compiles nothing. With scikit-build-core and
pybind11 importable, the PEP 517 hook runs directly in this environment (what
`pip wheel --no-build-isolation` does, without pip's start-up). Without them the build stops and
says what to install: an isolated build would fetch the pinned fastpath-llm from a package index,
where it is not published.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .write import BUILD_DIR

_BUILD_WHEEL = (
    "import sys\nfrom scikit_build_core.build import build_wheel\nprint(build_wheel(sys.argv[1]))\n"
)


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class BuildResult:
    wheel: Path
    extension: Path  # the extension placed in the package folder, so it imports in place
    seconds: float


def build_package(folder: Path, package: str) -> BuildResult:
    """Build `folder` (a generated package) into a wheel, and put its extension beside its sources."""
    started = time.perf_counter()
    folder = Path(folder).resolve()
    dist = folder / BUILD_DIR / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    for old in dist.glob("*.whl"):
        old.unlink()
    wheel = _build_wheel(folder, dist)
    extension = _place_extension(wheel, folder, package)
    return BuildResult(wheel, extension, time.perf_counter() - started)


def _build_wheel(folder: Path, dist: Path) -> Path:
    missing = [name for name in ("scikit_build_core", "pybind11") if importlib.util.find_spec(name) is None]
    if missing:
        raise BuildError(
            f"building {folder} needs {' and '.join(missing)} in this environment ({sys.executable}): "
            "pip install 'fastpath-llm[build]' (scikit-build-core, pybind11, cmake, ninja), or from a "
            "checkout pip install -e '.[build]'"
        )
    command = [sys.executable, "-c", _BUILD_WHEEL, str(dist)]
    log = folder / BUILD_DIR / "build.log"
    with open(log, "w", encoding="utf-8") as out:
        done = subprocess.run(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:])
        raise BuildError(f"building {folder} failed (full log: {log}):\n{tail}")
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"building {folder} left {len(wheels)} wheels in {dist}, expected one")
    return wheels[0]


def _place_extension(wheel: Path, folder: Path, package: str) -> Path:
    """Copy the built extension next to the package's sources, if it changed, so `import` finds it in place."""
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n
            for n in zf.namelist()
            if n.startswith(f"{package}/_hostdispatch") and n.endswith((".so", ".pyd"))
        ]
        if len(names) != 1:
            raise BuildError(f"{wheel.name} holds {len(names)} host-dispatch extensions, expected one")
        data = zf.read(names[0])
    target = folder / names[0]
    if not (target.is_file() and target.read_bytes() == data):
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(data)
        partial.replace(target)  # never leave a half-written extension to import
    return target


def installed_matches(wheel: Path) -> bool:
    """Whether exactly this wheel's files are installed in this environment."""
    # A wheel's RECORD lists each file's hash; an installed copy keeps those lines.
    import importlib.metadata  # slow to import, and only an install needs it

    with zipfile.ZipFile(wheel) as zf:
        record_name = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            return False
        wanted = _file_hashes(zf.read(record_name).decode())
        metadata_name = record_name.removesuffix("RECORD") + "METADATA"
        name = next(
            line.split(":", 1)[1].strip()
            for line in zf.read(metadata_name).decode().splitlines()
            if line.startswith("Name:")
        )
    try:
        installed = importlib.metadata.distribution(name).read_text("RECORD") or ""
    except importlib.metadata.PackageNotFoundError:
        return False
    return wanted <= _file_hashes(installed)


def _file_hashes(record: str) -> set[tuple[str, str]]:
    rows = (line.rsplit(",", 2) for line in record.splitlines() if line.strip())
    return {(path, digest) for path, digest, _size in rows if digest and ".dist-info/" not in path}
