"""fastpath-compile (bin/compile) MANIFEST... [-o DIR] [--validate | --check | --explain | --build | --install]

Exit status: 0 ok; 1 drift under --check, or a failed write or build; 2 a refusal: an invalid
manifest, a name that would collide, an output folder the compiler will not write into
(messages on stderr, or stdout in --format github|json; nothing written).

--validate runs every check that needs no GPU, checkpoint weights or torch, and writes nothing:
this module and what it imports on that path stay free of torch, Jinja and the build.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fastpath.schema.errors import Diagnostic, ManifestError, sort_key
from fastpath.schema.loader import LoadedManifest, load_manifest

from . import collisions
from .plan import Plan
from .report import FORMATS, render_diagnostics
from .resolve import resolve

OK, FAILED, INVALID = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Unit:
    """One manifest on its way to a package."""

    loaded: LoadedManifest
    plan: Plan
    folder: Path


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Compile fastpath manifests into generated packages.",
        epilog="exit status: 0 ok; 1 drift under --check, or a failed write or build; 2 a refusal (an "
        "invalid manifest, a name that would collide, an output folder it will not write into) or a "
        "usage error",
    )
    p.add_argument("manifests", nargs="*", metavar="MANIFEST", help="manifest YAML files")
    p.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        help="where packages go, one folder per manifest name (default: ./generated)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--validate",
        action="store_true",
        help="check the manifests (schema, cross-field rules, names, tensor-parallel sizes) without "
        "torch; write nothing; exit 2 if one is invalid",
    )
    mode.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a package is out of date"
    )
    mode.add_argument("--explain", action="store_true", help="print each Plan and its reasons; write nothing")
    mode.add_argument(
        "--build",
        action="store_true",
        help="also build each package (in place, and into the wheelhouse DIR/dist with fastpath's wheel)",
    )
    mode.add_argument(
        "--install", action="store_true", help="--build, then install each package (see --python)"
    )
    mode.add_argument(
        "--print-schema", action="store_true", help="print the manifest JSON Schema this fastpath reads"
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="how to print manifest errors: file:line:col lines (text), GitHub Actions workflow "
        "commands (github), or a JSON list of {file, line, column, path, message} (json)",
    )
    p.add_argument(
        "--python",
        metavar="PY",
        help="with --install: the interpreter whose environment gets the packages (default: the one "
        "running this command; same Python version)",
    )
    return p


def manifest_path(manifest: str, out_dir: Path) -> str:
    """How the lock file names a manifest, whatever the working directory: relative to the output
    folder's parent (the repository, for ./generated) when it is inside it, else its file name alone.
    Never a path that climbs out, so an installed package carries no trace of the build machine's
    folders."""
    source, root = Path(manifest).resolve(), out_dir.resolve().parent
    return source.relative_to(root).as_posix() if source.is_relative_to(root) else source.name


def main(argv: Sequence[str] | None = None, *, prog: str = "fastpath-compile") -> int:
    args = parser(prog).parse_args(argv)
    if args.print_schema:
        from fastpath.schema import json_schema_path

        print(json_schema_path().read_text(encoding="utf-8"), end="")
        return OK
    if not args.manifests:
        parser(prog).error("give at least one MANIFEST")
    # A file named twice (a shell glob and its path) is one manifest, not a collision with itself.
    first: dict[Path, str] = {}
    for m in args.manifests:
        first.setdefault(Path(m).resolve(), m)
    args.manifests = list(first.values())
    if args.python and not args.install:
        parser(prog).error("--python goes with --install")
    out_dir = args.output_dir or Path.cwd() / "generated"
    writes = not (args.validate or args.explain or args.check)
    if writes and (out_dir.exists() or out_dir.is_symlink()) and not out_dir.is_dir():
        named = f"-o {out_dir}" if args.output_dir else f"the output folder {out_dir}"
        print(f"error: {named}: not a folder; name a folder (it is made if missing)", file=sys.stderr)
        return INVALID
    target = args.python if args.install else None
    try:
        units, problems = prepare(args.manifests, out_dir, target)
    except OSError as exc:  # the compiler's own failure, not the manifest's
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    if problems or args.validate:
        if args.format == "text":
            _note_unseen_hooks(units)
        return _report(problems, args.format, [u.loaded.filename for u in units])
    if args.explain:
        from .explain import explain

        print("\n".join(explain(u.plan) for u in units), end="")
        return OK
    rendered = _render(units)
    if rendered is None:
        return FAILED
    if args.check:
        command = [prog, *args.manifests] + (["-o", str(args.output_dir)] if args.output_dir else [])
        return _check(units, rendered, command)
    code = _write(units, rendered)
    if code != OK or not (args.build or args.install):
        return code
    from .deploy import deploy

    return deploy(units, out_dir, install=args.install, python=args.python or sys.executable)


def prepare(
    manifests: Sequence[str], out_dir: Path, install_python: str | None = None
) -> tuple[list[Unit], list[Diagnostic]]:
    """Load and resolve every manifest and check its name before anything is written."""
    loaded_plans: list[tuple[LoadedManifest, Plan]] = []
    problems: list[Diagnostic] = []
    for manifest in manifests:
        try:
            loaded = load_manifest(manifest)
            loaded_plans.append((loaded, resolve(loaded, manifest_path(manifest, out_dir))))
        except ManifestError as exc:
            problems += exc.diagnostics
    problems += collisions.duplicates(loaded_plans)
    if loaded_plans:
        problems += collisions.taken(loaded_plans, where="in this environment")
        if install_python:
            problems += collisions.taken(loaded_plans, install_python, f"in {install_python}'s environment")
    units = [Unit(loaded, plan, out_dir / plan.name) for loaded, plan in loaded_plans]
    return units, sorted(set(problems), key=sort_key)


def _note_unseen_hooks(units: list[Unit]) -> None:
    """A hook whose module this Python cannot find was not checked: say so, rather than let "valid"
    claim it (it may be installed only where the package runs)."""
    from . import hook_lookup

    for u in units:
        hooks = u.plan.hooks
        refs = [hooks.decode_prologue] if hooks.decode_prologue else []
        refs += [r for event in hooks.executor_events().values() for r in event]
        for ref in refs:
            if hook_lookup.unseen(ref.module):
                where = f"{u.loaded.filename}:{ref.line}" if ref.line else u.loaded.filename
                print(
                    f"{where}: note: hook {ref.path!r} not checked: no module {ref.module!r} is importable "
                    f"here ({sys.executable}, or in the working directory); it is looked up when the "
                    "package is imported (put its folder on PYTHONPATH to check it now)",
                    file=sys.stderr,
                )


def _report(problems: list[Diagnostic], fmt: str, valid: list[str]) -> int:
    """Print the problems in `fmt` (text on stderr, the rest on stdout); INVALID if there are any."""
    text = render_diagnostics(problems, fmt)
    if fmt == "text":
        print(text, end="", file=sys.stderr)
        if not problems:
            print("".join(f"{manifest}: valid\n" for manifest in valid), end="")
    else:
        print(text, end="")
    return INVALID if problems else OK


def _render(units: list[Unit]) -> list[dict[str, str]] | None:
    from .render import RenderError, render

    try:
        return [render(u.plan) for u in units]
    except (RenderError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _check(units: list[Unit], rendered: list[dict[str, str]], command: list[str]) -> int:
    from .write import STRAY, drift

    stale = foreign = False
    for u, files in zip(units, rendered, strict=True):
        for d in drift(files, u.folder):
            stale, foreign = stale or d.kind != STRAY, foreign or d.kind == STRAY
            print(f"{_shown(u.folder / d.path)}: {d.kind}", file=sys.stderr)
    if stale:
        print(f"generated packages are out of date; regenerate with: {shlex.join(command)}", file=sys.stderr)
    if foreign:  # compiling again keeps what the compiler does not own
        print("files the compiler did not write are in a package: remove them", file=sys.stderr)
    if stale or foreign:
        return FAILED
    return OK


def _write(units: list[Unit], rendered: list[dict[str, str]]) -> int:
    from .context import MODULE_NAME
    from .write import STRAY, NotAGeneratedPackage, check_target, strays, write_package

    pairs = list(zip(units, rendered, strict=True))
    try:
        for u, files in pairs:  # refuse before anything is written
            check_target(u.folder, files)
        for u, files in pairs:
            result = write_package(files, u.folder, f"{u.plan.package}/{MODULE_NAME}")
            print(
                f"{_shown(u.folder)}: {len(result.written)} written, "
                f"{len(result.unchanged)} unchanged, {len(result.removed)} removed"
            )
            for rel in strays(files, u.folder):
                print(f"warning: {_shown(u.folder / rel)}: {STRAY}", file=sys.stderr)
    except NotAGeneratedPackage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return INVALID
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return FAILED
    return OK
