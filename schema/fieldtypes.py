"""Field types of the manifest: each carries its own check, so every model field stays one line.

A value that passes these checks is safe to use as an identifier in generated code; the
compiler relies on that, and escapes everything else.
"""

from __future__ import annotations

import itertools
import keyword
import re
import sys
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema
from pydantic.fields import FieldInfo

from .names import CATALOG_MODELS, FMHA_LIBRARIES, LLM_INT_BOUNDS, RANDOM_PREFIX, RANDOM_PRESETS
from .suggest import did_you_mean

Status = Literal["stable", "prototype"]


def spec(
    default: Any = ..., *, doc: str, status: Status = "stable", unique: bool = False, **kwargs: Any
) -> FieldInfo:
    """A model field with its documentation and API status (shown in the JSON Schema). `unique`: a list
    whose items the model refuses twice, which the JSON Schema says too (uniqueItems)."""
    extra: dict[str, Any] = {"status": status, **({"uniqueItems": True} if unique else {})}
    return Field(default, description=doc, json_schema_extra=extra, **kwargs)


def bounds(llm_kwarg: str) -> dict[str, int]:
    """ge= and le= of a field, from the bounds the runtime enforces too (fastpath.vocab)."""
    least, greatest = LLM_INT_BOUNDS[llm_kwarg]
    return {"ge": least, "le": greatest}


_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATH_PATTERN = rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}$"
PACKAGE_NAME_PATTERN = r"^[a-z][a-z0-9_-]*$"
PACKAGE_NAME_MAX = 64
# Names a generated package may never take, installed here or not: the folders of a generated
# package and its output folder, and the tools that build and test packages.
RESERVED_PACKAGES = {
    "build": "the build folder of every generated package (and PyPA's `build`)",
    "dist": "the wheelhouse folder that `--build` writes beside the packages",
    "src": "the C++ source folder of every generated package",
    "pytest": "the test runner",
    "_pytest": "the test runner",
    "conftest": "the test runner's configuration modules",
    "test": "the standard library's tests and test runners' folders",
    "tests": "test runners' folders",
    "pip": "the package installer",
    "setuptools": "the build backend",
    "wheel": "the wheel builder",
    "pybind11": "the C++ bindings every generated package builds with",
    "scikit_build_core": "the build backend of every generated package",
    "cmake": "the build tool",
    "ninja": "the build tool",
    "sitecustomize": "the module every Python start imports when it is on the path",
    "usercustomize": "the module every Python start imports when it is on the path",
    "nvidia": "the namespace of the CUDA libraries' wheels that torch and Triton load",
    "triton": "the kernel compiler the engine runs on CUDA",
}
# What an installed package imports at run time (fastpath-llm's dependencies and extras, and theirs
# that the server and tokenizers load): a package of one of these names would be installed over it.
# Not read from this environment's metadata, so a manifest is refused alike wherever it is checked.
_RUNTIME_IMPORTS = {
    "torch": "fastpath's tensor library",
    "pydantic": "fastpath's settings models",
    "pydantic_core": "fastpath's settings models",
    "jinja2": "fastpath's chat templates",
    "yaml": "fastpath's YAML reader (PyYAML)",
    "safetensors": "fastpath's checkpoint reader",
    "numpy": "fastpath's array library",
    "rich": "fastpath's progress display",
    "tqdm": "generate()'s progress bar",
    "transformers": "fastpath's tokenizers and configs",
    "tokenizers": "fastpath's tokenizers",
    "huggingface_hub": "the tokenizers' checkpoint loader",
    "xgrammar": "guided decoding (fastpath-llm[guided])",
    "llguidance": "guided decoding (fastpath-llm[guided])",
    "gguf": "catalog models' weights (fastpath-llm[smollm])",
    "accelerate": "catalog models' loading (fastpath-llm[smollm])",
    "fastapi": "fastpath's HTTP server (fastpath-llm[serve])",
    "starlette": "fastpath's HTTP server (fastpath-llm[serve])",
    "uvicorn": "fastpath's HTTP server (fastpath-llm[serve])",
    "httpx": "fastpath's HTTP server (fastpath-llm[serve])",
    "httptools": "fastpath's HTTP server (fastpath-llm[serve])",
    "uvloop": "fastpath's HTTP server (fastpath-llm[serve])",
    "h11": "fastpath's HTTP server (fastpath-llm[serve])",
    "anyio": "fastpath's HTTP server (fastpath-llm[serve])",
    "prometheus_client": "fastpath's metrics (fastpath-llm[serve])",
}
RESERVED_PACKAGES.update(_RUNTIME_IMPORTS)


def _identifier_problem(part: str) -> str:
    if not re.fullmatch(_IDENTIFIER, part):
        return f"{part!r} is not an ASCII Python identifier"
    if keyword.iskeyword(part):
        return f"{part!r} is a Python keyword"
    return ""


def split_import_path(path: str) -> tuple[str, str]:
    """'pkg.module:Name' -> ('pkg.module', 'Name'); ValueError says what is wrong."""
    if path.count(":") != 1:
        raise ValueError(f"import path {path!r} must look like 'package.module:Name' (one ':')")
    module, attr = path.split(":")
    for part in [*module.split("."), attr]:
        if problem := _identifier_problem(part):
            raise ValueError(f"import path {path!r}: {problem}")
    return module, attr


def _check_import_path(path: str) -> str:
    split_import_path(path)
    return path


def python_package(name: str) -> str:
    """The import name of a manifest's package: its name with '-' as '_'."""
    return name.replace("-", "_")


def _check_package_name(name: str) -> str:
    if len(name) > PACKAGE_NAME_MAX or not re.fullmatch(PACKAGE_NAME_PATTERN, name):
        raise ValueError(
            f"{name!r} must be lower-case letters, digits, '-' and '_', start with a letter, "
            f"and be at most {PACKAGE_NAME_MAX} characters"
        )
    package = python_package(name)
    if keyword.iskeyword(package):
        raise ValueError(f"{name!r} would make the package {package!r}, a Python keyword")
    if package == "fastpath" or package in sys.stdlib_module_names:
        raise ValueError(f"{name!r} would make the package {package!r}, which shadows an existing module")
    if package in RESERVED_PACKAGES:
        raise ValueError(
            f"{name!r} would make the package {package!r}, a name taken by {RESERVED_PACKAGES[package]}"
        )
    return name


def _check_checkpoint(checkpoint: str) -> str:
    if checkpoint.startswith(RANDOM_PREFIX):
        preset = checkpoint.removeprefix(RANDOM_PREFIX)
        if preset not in RANDOM_PRESETS:
            raise ValueError(
                f"unknown random preset {preset!r} (known: {', '.join(RANDOM_PRESETS)})"
                + did_you_mean(preset, RANDOM_PRESETS)
            )
        return checkpoint
    if not checkpoint.strip():
        raise ValueError(
            f"is empty: give a Hugging Face model folder, a catalog model ({', '.join(CATALOG_MODELS)}) "
            "or 'random:<preset>'"
        )
    # A path never needs control characters, and a lone surrogate cannot be written to a file.
    bad = next((c for c in checkpoint if ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF), None)
    if bad is not None:
        raise ValueError(f"{checkpoint!r} holds the control character {bad!r}; a path never needs one")
    return checkpoint


def _strictly_increasing(sizes: tuple[int, ...]) -> tuple[int, ...]:
    for before, after in itertools.pairwise(sizes):
        if after <= before:
            raise ValueError(f"must be sorted and unique: {after} follows {before}")
    return sizes


def _exactly_auto_or_bool(value: Any) -> Any:
    # A Literal compares by equality, where 1 == True; a manifest must say true, false or auto.
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"expected auto, true or false, got {value!r}")
    return value


def _check_host(host: str) -> str:
    if not re.fullmatch(HOST_PATTERN, host):
        raise ValueError(f"{host!r} is not a host name or an IP address")
    return host


def _check_served_name(name: str) -> str:
    if not name.isprintable() or not name.strip() or len(name) > SERVED_NAME_MAX:
        raise ValueError(f"{name!r} must be printable, not blank, and at most {SERVED_NAME_MAX} characters")
    return name


HOST_PATTERN = r"^[A-Za-z0-9._:\-\[\]]{1,253}$"
ENV_VAR_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
SERVED_NAME_MAX = 256

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]

PackageName = Annotated[
    str,
    AfterValidator(_check_package_name),
    WithJsonSchema({"type": "string", "pattern": PACKAGE_NAME_PATTERN, "maxLength": PACKAGE_NAME_MAX}),
]
# No control character, and one that str.strip() keeps (Python's whitespace, spelled out: ECMA's \s
# differs): what the validators refuse that a JSON Schema can say.
_KEPT = r"[^\u0000-\u0020\u007f\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
_PRINTABLE_NOT_BLANK = rf"^[^\u0000-\u001f\u007f]*{_KEPT}[^\u0000-\u001f\u007f]*$"
Checkpoint = Annotated[
    str,
    AfterValidator(_check_checkpoint),
    WithJsonSchema({"type": "string", "pattern": _PRINTABLE_NOT_BLANK}),
]
ImportPath = Annotated[
    str,
    AfterValidator(_check_import_path),
    WithJsonSchema({"type": "string", "pattern": IMPORT_PATH_PATTERN}),
]
FmhaName = Literal[FMHA_LIBRARIES]
FmhaOrder = Annotated[tuple[FmhaName, ...], Field(min_length=1)]
BatchSizes = Annotated[
    tuple[PositiveInt, ...],
    Field(min_length=1, json_schema_extra={"uniqueItems": True}),  # increasing: no size twice
    AfterValidator(_strictly_increasing),
]
Host = Annotated[
    str, AfterValidator(_check_host), WithJsonSchema({"type": "string", "pattern": HOST_PATTERN})
]
EnvVarName = Annotated[str, Field(pattern=ENV_VAR_PATTERN, max_length=128)]
ServedModelName = Annotated[
    str,
    AfterValidator(_check_served_name),
    WithJsonSchema({"type": "string", "maxLength": SERVED_NAME_MAX, "pattern": _PRINTABLE_NOT_BLANK}),
]
AutoOrBool = Annotated[Literal["auto", True, False], BeforeValidator(_exactly_auto_or_bool)]
