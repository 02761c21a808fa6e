"""fastpath.compiler: a manifest -> a built, importable package, in four stages.

resolve(load_manifest(path)) -> Plan        every default filled, every gate decided
render(plan) -> {path: text}                deterministic
write_package(files, folder)                atomic, write-if-different
build_package(folder, package)              scikit-build-core, cached build folder
native_llm(path)                            the manifest on the native engine (hooks read at run time)
"""

from .build import BuildError, BuildResult, build_package
from .native import native_llm, native_llm_from_text
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
    "native_llm",
    "native_llm_from_text",
    "render",
    "resolve",
    "write_package",
]
