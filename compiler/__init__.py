"""fastpath.compiler: a manifest -> a built, importable package, in four stages.

resolve(load_manifest(path)) -> Plan        every default filled, every gate decided
render(plan) -> {path: text}                deterministic
write_package(files, folder)                atomic, write-if-different
build_package(folder, package)              scikit-build-core, cached build folder
"""

from .build import BuildError, BuildResult, build_package
from .plan import Decision, HookPlan, HookRef, Plan
from .render import RenderError, render
from .resolve import resolve
from .write import Drift, NotAGeneratedPackage, WriteResult, drift, write_package

__all__ = [
    "BuildError",
    "BuildResult",
    "Decision",
    "Drift",
    "HookPlan",
    "HookRef",
    "NotAGeneratedPackage",
    "Plan",
    "RenderError",
    "WriteResult",
    "build_package",
    "drift",
    "render",
    "resolve",
    "write_package",
]
