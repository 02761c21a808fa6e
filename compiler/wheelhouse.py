"""The wheelhouse `--build` leaves: each generated wheel beside the fastpath-llm wheel it pins.

`pip install --find-links DIR <distribution>` then installs a generated package on a machine
that has neither the checkout nor the generated sources. fastpath's wheel is built from the
checkout fastpath runs from (its CMake build folder kept under build/, so a rebuild compiles
nothing new), or, for a fastpath installed from the package index, downloaded from there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import distribution
from .build import BuildError
from .swap import output_lock

DIST_DIR = "dist"

_BUILD_WHEEL = (
    "import sys\nfrom scikit_build_core.build import build_wheel\n"
    "print(build_wheel(sys.argv[1], {'build-dir': sys.argv[2]}))\n"
)


def wheel_prefix(dist_name: str) -> str:
    """How a distribution's wheels start: 'fastpath-gen-a' -> 'fastpath_gen_a-'."""
    return dist_name.replace("-", "_").replace(".", "_") + "-"


def add_wheel(wheel: Path, house: Path, dist_name: str) -> Path:
    """Copy `wheel` into `house`, replacing the distribution's older wheels there."""
    house.mkdir(parents=True, exist_ok=True)
    for old in house.glob(wheel_prefix(dist_name) + "*.whl"):
        if old.name != wheel.name:
            old.unlink()
    target = house / wheel.name
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(wheel, partial)
    partial.replace(target)
    return target


def fastpath_wheel(house: Path) -> Path:
    """fastpath-llm's wheel of the running version, in `house`: built from the checkout fastpath runs
    from; for an installed fastpath, the one already in `house` (put there by hand), else downloaded."""
    house = house.resolve()  # the build runs in the checkout: a relative folder would land there
    house.mkdir(parents=True, exist_ok=True)
    root = distribution.source_tree()
    if root is None and (present := _present(house)) is not None:
        return present
    with tempfile.TemporaryDirectory(prefix=".fastpath-wheel.", dir=house) as tmp:
        built = _build_from_source(root, Path(tmp)) if root else _download(Path(tmp))
        return add_wheel(built, house, distribution.DISTRIBUTION)


def _present(house: Path) -> Path | None:
    """A fastpath-llm wheel of the running version already in `house`."""
    prefix = wheel_prefix(distribution.DISTRIBUTION) + distribution.version() + "-"
    wheels = sorted(house.glob(prefix + "*.whl"))
    return wheels[0] if len(wheels) == 1 else None


def _build_from_source(root: Path, out: Path) -> Path:
    build_dir = root / "build" / "wheelhouse"  # kept: an unchanged rebuild compiles nothing
    build_dir.mkdir(parents=True, exist_ok=True)
    # Two builds from one checkout share that folder: one at a time.
    with output_lock(build_dir):
        return _build_locked(root, out, build_dir)


def _build_locked(root: Path, out: Path, build_dir: Path) -> Path:
    log = out / "build.log"
    if importlib.util.find_spec("scikit_build_core") and importlib.util.find_spec("pybind11"):
        command = [sys.executable, "-c", _BUILD_WHEEL, str(out), str(build_dir)]
    else:
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(root)]
        command.append(f"-Cbuild-dir={build_dir}")
    with open(log, "w", encoding="utf-8") as f:
        done = subprocess.run(
            command, cwd=root, stdout=f, stderr=subprocess.STDOUT, check=False, env=os.environ
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:])
        raise BuildError(f"building {distribution.DISTRIBUTION}'s wheel from {root} failed:\n{tail}")
    return _one_wheel(out)


def _download(out: Path) -> Path:
    requirement = distribution.requirement()
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
    done = subprocess.run(
        [*command, "-d", str(out), requirement], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BuildError(
            f"fastpath runs from an installed wheel, and `pip download {requirement}` failed; put that "
            f"wheel into {out.parent} yourself and build again:\n{done.stdout}{done.stderr}"
        )
    return _one_wheel(out)


def _one_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob(wheel_prefix(distribution.DISTRIBUTION) + "*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one {distribution.DISTRIBUTION} wheel in {folder}, found {len(wheels)}")
    return wheels[0]
