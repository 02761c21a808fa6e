"""Compile and build times, side by side in one run: `python bench/compile.py [--quick] [--out FILE]`.

Per manifest, in this process: validate, resolve, render and write, cold (first compile in the
process, into an empty folder: Jinja compiles its templates, every file is written) and no-op
(the same again: nothing is written). Only the first manifest's cold compile pays for Jinja compiling
its templates. Then building one generated package with scikit-build-core: cold (an empty build
folder), no-op (unchanged sources), after a comment added to the manifest (recompile + rebuild:
only __init__.py and the lock change), and after a dispatch-mode change (only the extension's
source changes; the build log says which objects were compiled).
Targets: compile <= 150 ms in-process; a no-op or comment-only rebuild <= 2 s. Ratios to target
are printed. Results: JSON (--out) and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPILE_TARGET_MS = 150.0
NOOP_BUILD_TARGET_S = 2.0


def import_seconds() -> float:
    """Importing the compiler in a fresh interpreter (pydantic, Jinja, PyYAML included)."""
    code = "import time; t = time.perf_counter(); import fastpath.compiler; print(time.perf_counter() - t)"
    return float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )


def compile_stages(manifest: Path, out: Path) -> dict[str, float]:
    """Milliseconds of each stage for one compile of `manifest` into `out`."""
    from fastpath.compiler import render, resolve, write_package
    from fastpath.schema import load_manifest

    times = {}
    t0 = time.perf_counter()
    loaded = load_manifest(manifest)
    t1 = time.perf_counter()
    plan = resolve(loaded, manifest.relative_to(REPO).as_posix())
    t2 = time.perf_counter()
    files = render(plan)
    t3 = time.perf_counter()
    write_package(files, out / plan.name)
    t4 = time.perf_counter()
    times.update(validate=t1 - t0, resolve=t2 - t1, render=t3 - t2, write=t4 - t3, total=t4 - t0)
    return {k: v * 1000 for k, v in times.items()}


def measure_compiles(manifests: list[Path], repeats: int, out: Path) -> dict[str, dict]:
    results = {}
    for manifest in manifests:
        cold = compile_stages(manifest, out)
        noop = [compile_stages(manifest, out) for _ in range(repeats)]
        results[manifest.stem] = {
            "cold_ms": cold,
            "noop_ms": {stage: statistics.median(run[stage] for run in noop) for stage in cold},
        }
    return results


def compiled_objects(folder: Path) -> list[str]:
    """The objects ninja compiled in the last build, from its log."""
    log = (folder / "build" / "build.log").read_text(encoding="utf-8")
    return re.findall(r"Building CXX object \S+?/([^/\s]+)\.o", log)


def rebuild(text: str, manifest: Path, folder: Path) -> dict:
    """Compile `text` as the manifest (into `folder`) and build it: seconds, files written, objects compiled."""
    from fastpath.compiler import build_package, render, resolve, write_package
    from fastpath.schema import parse_manifest

    started = time.perf_counter()
    plan = resolve(parse_manifest(text, str(manifest)), manifest.relative_to(REPO).as_posix())
    written = write_package(render(plan), folder).written
    build_package(folder, plan.package)
    seconds = time.perf_counter() - started
    return {"s": seconds, "written": sorted(written), "compiled": compiled_objects(folder)}


def measure_build(manifest: Path, out: Path) -> dict:
    text = manifest.read_text(encoding="utf-8")
    folder = out / f"build-{manifest.stem}"
    cold = rebuild(text, manifest, folder)
    noop = rebuild(text, manifest, folder)
    comment = rebuild("# a comment, and nothing else\n" + text, manifest, folder)
    mode = "blocking" if "mode: blocking" not in text else "spin"
    dispatch = rebuild(text + f"host_dispatch: {{mode: {mode}}}\n", manifest, folder)
    return {
        "manifest": manifest.stem,
        "cold": cold,
        "noop": noop,
        "comment": comment,
        "dispatch_mode": dispatch,
    }


def report(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bin/compile stages, ms (target: total <= {COMPILE_TARGET_MS:.0f} ms in-process)")
    stages = ["validate", "resolve", "render", "write", "total"]
    table.add_column("manifest", no_wrap=True)
    table.add_column("run")
    for stage in stages:
        table.add_column(stage, justify="right")
    table.add_column("total / target", justify="right")
    for name, r in results["compile"].items():
        for run in ("cold", "noop"):
            ms = r[f"{run}_ms"]
            row = [f"{ms[s]:.2f}" for s in stages]
            table.add_row(name, run, *row, f"{ms['total'] / COMPILE_TARGET_MS:.3f}")
    console = Console()
    console.print(table)
    console.print(f"importing fastpath.compiler in a fresh interpreter: {results['import_s'] * 1000:.0f} ms")
    build = results.get("build")
    if build:
        builds = Table(
            title=f"compile + scikit-build-core build of {build['manifest']}, s "
            f"(target: no-op and comment-only <= {NOOP_BUILD_TARGET_S} s)"
        )
        for column in ("change", "s", "s / target", "files written", "objects compiled"):
            builds.add_column(column, justify="right")
        for change, row in build_rows(build):
            builds.add_row(change, *row)
        console.print(builds)


BUILD_CHANGES = {
    "cold": "none (empty build folder)",
    "noop": "none",
    "comment": "a comment in the manifest",
    "dispatch_mode": "host_dispatch.mode",
}


def build_rows(build: dict) -> list[tuple[str, list[str]]]:
    rows = []
    for key, change in BUILD_CHANGES.items():
        r = build[key]
        target = f"{r['s'] / NOOP_BUILD_TARGET_S:.3f}" if key != "cold" else "-"
        rows.append(
            (change, [f"{r['s']:.2f}", target, str(len(r["written"])), ", ".join(r["compiled"]) or "-"])
        )
    return rows


def markdown(results: dict) -> str:
    lines = [
        "<!-- @generated by bench/compile.py -->",
        f"# bin/compile: compile and build times (Python {results['python']}, {results['machine']})",
        "",
        f"Importing fastpath.compiler in a fresh interpreter: {results['import_s'] * 1000:.0f} ms.",
        "",
        f"| manifest | run | validate | resolve | render | write | total ms | total / {COMPILE_TARGET_MS:.0f} ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["compile"].items():
        for run in ("cold", "noop"):
            ms = r[f"{run}_ms"]
            cells = [f"{ms[s]:.2f}" for s in ("validate", "resolve", "render", "write", "total")]
            lines.append(f"| {name} | {run} | {' | '.join(cells)} | {ms['total'] / COMPILE_TARGET_MS:.3f} |")
    build = results.get("build")
    if build:
        lines += [
            "",
            f"Compile + scikit-build-core build of `{build['manifest']}` (target: <= {NOOP_BUILD_TARGET_S} s "
            "for a no-op or comment-only rebuild):",
            "",
            "| change | s | s / target | files written | objects compiled |",
            "|---|---|---|---|---|",
        ]
        lines += [f"| {change} | {' | '.join(row)} |" for change, row in build_rows(build)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifests", nargs="*", type=Path, help="default: examples/*.yaml")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--no-build", action="store_true", help="skip the scikit-build-core build")
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench" / "results" / "compile.json",
        help="JSON results (.md beside)",
    )
    args = parser.parse_args()
    manifests = [m.resolve() for m in args.manifests] or sorted((REPO / "examples").glob("*.yaml"))

    results: dict = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "targets": {"compile_ms": COMPILE_TARGET_MS, "noop_build_s": NOOP_BUILD_TARGET_S},
        "import_s": import_seconds(),
    }
    with tempfile.TemporaryDirectory(prefix="fastpath-bench-") as tmp:
        results["compile"] = measure_compiles(manifests, 5 if args.quick else 30, Path(tmp))
        if not args.no_build:
            results["build"] = measure_build(manifests[0], Path(tmp))
    report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(results), encoding="utf-8")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
