"""examples/ compile, and generated/ holds exactly what they compile to."""

import subprocess
import sys

from compile_helpers import EXAMPLES, REPO


def test_generated_packages_are_up_to_date_with_the_examples():
    done = subprocess.run(
        [sys.executable, "bin/compile", "--check", *(e.relative_to(REPO).as_posix() for e in EXAMPLES)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr


def test_every_example_has_its_package_and_nothing_else_is_generated():
    # dist/ is the wheelhouse `--build` leaves (git ignores it)
    packages = sorted(p.name for p in (REPO / "generated").iterdir() if p.is_dir() and p.name != "dist")
    from fastpath.schema import load_manifest

    assert packages == sorted(load_manifest(e).manifest.name for e in EXAMPLES)
