"""bin/compile MANIFEST... [-o DIR] [--check | --explain | --build | --install]

Exit status: 0 ok; 1 drift under --check, or a failed write or build; 2 an invalid manifest
(messages on stderr, nothing written).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fastpath.schema.errors import ManifestError
from fastpath.schema.loader import load_manifest

from .plan import Plan
from .render import RenderError, render
from .resolve import resolve
from .write import NotAGeneratedPackage, drift, write_package

OK, FAILED, INVALID = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Unit:
    """One manifest on its way to a package."""

    manifest: str
    plan: Plan
    files: dict[str, str]
    folder: Path


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Compile fastpath manifests into generated packages.")
    p.add_argument("manifests", nargs="+", metavar="MANIFEST", help="manifest YAML files")
    p.add_argument("-o", "--output-dir", type=Path, help="where packages go, one folder per manifest name")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a package is out of date"
    )
    mode.add_argument("--explain", action="store_true", help="print each Plan and its reasons; write nothing")
    mode.add_argument(
        "--build", action="store_true", help="also build each package in place (scikit-build-core)"
    )
    mode.add_argument("--install", action="store_true", help="also build and install each package here")
    return p


def display_path(manifest: str, root: Path) -> str:
    """How generated files name a manifest: relative to `root` when inside it, else as given."""
    try:
        return Path(manifest).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return Path(manifest).as_posix()


def main(
    argv: Sequence[str] | None = None, *, root: Path | None = None, prog: str = "fastpath-compile"
) -> int:
    """`root`: the repository; manifests are named relative to it, and -o defaults to root/generated."""
    args = parser(prog).parse_args(argv)
    root = root or Path.cwd()
    out_dir = args.output_dir or root / "generated"

    try:
        units, invalid = _prepare(args.manifests, root, out_dir)
    except (RenderError, OSError) as exc:  # the compiler's own failure, not the manifest's
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    if invalid:
        print(invalid, file=sys.stderr)
        return INVALID
    if args.explain:
        from .explain import explain

        print("\n".join(explain(u.plan) for u in units), end="")
        return OK
    if args.check:
        return _check(
            units, [prog, *args.manifests] + (["-o", str(args.output_dir)] if args.output_dir else [])
        )
    try:
        for u in units:
            result = write_package(u.files, u.folder)
            print(
                f"{display_path(str(u.folder), Path.cwd())}: {len(result.written)} written, "
                f"{len(result.unchanged)} unchanged, {len(result.removed)} removed"
            )
    except (NotAGeneratedPackage, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    if args.build or args.install:
        return _build(units, install=args.install)
    return OK


def _prepare(manifests: Sequence[str], root: Path, out_dir: Path) -> tuple[list[Unit], str]:
    """Load, resolve and render every manifest before anything is written; the str lists invalid ones."""
    units, errors = [], []
    for manifest in manifests:
        try:
            plan = resolve(load_manifest(manifest), display_path(manifest, root))
        except ManifestError as exc:
            errors.append(str(exc))
            continue
        units.append(Unit(manifest, plan, render(plan), out_dir / plan.name))
    seen: dict[str, str] = {}
    for u in units:
        if u.plan.name in seen:
            errors.append(
                f"{u.manifest}:1:1: error: name {u.plan.name!r} is also the name of {seen[u.plan.name]}"
            )
        seen.setdefault(u.plan.name, u.manifest)
    return units, "\n".join(errors)


def _check(units: list[Unit], command: list[str]) -> int:
    stale = False
    for u in units:
        for d in drift(u.files, u.folder):
            stale = True
            print(f"{display_path(str(u.folder / d.path), Path.cwd())}: {d.kind}", file=sys.stderr)
    if stale:
        print(f"generated packages are out of date; regenerate with: {shlex.join(command)}", file=sys.stderr)
        return FAILED
    return OK


def _build(units: list[Unit], *, install: bool) -> int:
    from rich.console import Console

    from .build import BuildError, build_package

    console = Console(stderr=True)
    for u in units:
        with console.status(f"building {u.plan.distribution} with scikit-build-core..."):
            try:
                result = build_package(u.folder, u.plan.package, install=install)
            except BuildError as exc:
                console.print(f"error: {exc}", style="red", markup=False, highlight=False)
                return FAILED
        where = (
            ("installed" if result.installed else "already installed")
            if install
            else f"in place: {result.extension}"
        )
        console.print(
            f"{u.plan.distribution}: built in {result.seconds:.1f} s, {where}", markup=False, highlight=False
        )
    return OK
