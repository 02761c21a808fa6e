"""Compile and build times, side by side in one run: `python bench/compile.py [--quick] [--out FILE]`.

Per manifest, in this process: validate, resolve, render and write, cold (first compile in the
process, into an empty folder: Jinja compiles its templates, every file is written) and no-op
(the same again: nothing is written). Only the first manifest's cold compile pays for Jinja compiling
its templates. Then building one generated package with
scikit-build-core, cold (an empty build folder) and no-op (unchanged sources).
Targets: compile <= 150 ms in-process; a no-op rebuild <= 2 s. Ratios to target are printed.
"""

from __future__ import annotations

import argparse
import json
import platform
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


def measure_build(manifest: Path, out: Path) -> dict[str, float]:
    from fastpath.compiler import build_package, render, resolve, write_package
    from fastpath.schema import load_manifest

    plan = resolve(load_manifest(manifest), manifest.relative_to(REPO).as_posix())
    folder = out / f"build-{plan.name}"
    write_package(render(plan), folder)
    cold = build_package(folder, plan.package)
    noop = build_package(folder, plan.package)
    return {"manifest": manifest.stem, "cold_s": cold.seconds, "noop_s": noop.seconds}


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
            title=f"scikit-build-core build of {build['manifest']}, s (target: no-op <= {NOOP_BUILD_TARGET_S} s)"
        )
        for column in ("cold", "no-op", "no-op / cold", "no-op / target"):
            builds.add_column(column, justify="right")
        builds.add_row(
            f"{build['cold_s']:.2f}",
            f"{build['noop_s']:.2f}",
            f"{build['noop_s'] / build['cold_s']:.3f}",
            f"{build['noop_s'] / NOOP_BUILD_TARGET_S:.3f}",
        )
        console.print(builds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifests", nargs="*", type=Path, help="default: examples/*.yaml")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--no-build", action="store_true", help="skip the scikit-build-core build")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "compile.json", help="JSON results")
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
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
