"""`--install`: put a built wheel into an environment, with the wheelhouse as its package source.

The environment is the interpreter running the compiler unless `--python` names another; the
compiler has already refused a package whose name that environment imports from elsewhere, so
an install never overwrites another distribution's files.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .build import BuildError, installed_matches


def install_wheel(wheel: Path, house: Path, python: str) -> bool:
    """Install `wheel` into `python`'s environment; False when exactly this wheel is there already."""
    if Path(python) == Path(sys.executable) and installed_matches(wheel):
        return False
    pip = [python, "-m", "pip", "install", "-q", "--find-links", str(house)]
    # The wheel replaces any earlier build of this package (same version or not)...
    _pip([*pip, "--no-deps", "--force-reinstall", str(wheel)], wheel)
    if Path(python) != Path(sys.executable):
        # ...and what it depends on comes from the wheelhouse or the index, unless already there.
        _pip([*pip, str(wheel)], wheel)
    return True


def _pip(command: list[str], wheel: Path) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"installing {wheel.name} failed:\n{done.stdout}{done.stderr}")
