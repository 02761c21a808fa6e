"""The host-dispatch extensions that the test_hostfunc*.py tests run against.

Each entry is an importable module defining fastpath's host-dispatch module
(cpp/include/fastpath/dispatch_module.hpp). The native binding takes the mode at run time;
a generated extension fixes it (``FIXED_MODE``) and is tested in that mode only. Add generated
extensions to EXTENSIONS, or list them in $FASTPATH_HOSTDISPATCH_EXTS (comma-separated), and the
same tests run on them: "the generated extension and the native binding pass the same
host-dispatch tests". The simulated device comes from its own test-only extension (`sim_extension()`),
and drives the engine of any of them.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

EXTENSIONS: list[str] = ["fastpath.runtime._hostdispatch"]
SIM_EXTENSION = "fastpath.runtime._hostdispatch_sim"
EXTRA_ENV = "FASTPATH_HOSTDISPATCH_EXTS"
ALL_MODES = ("inline", "blocking", "spin", "auto")

# On a simulated device: (mode, SimDevice keyword arguments, the backend that mode must pick).
SIM_BACKENDS = (
    ("blocking", {}, "blocking"),
    ("spin", {}, "hostfunc_v2"),
    ("spin", {"hostfunc_v2": False}, "doorbell"),  # the queue ring
    ("spin", {"hostfunc_v2": False, "queue": False}, "doorbell"),  # two memory operations
    ("auto", {"hostfunc_v2": False}, "doorbell"),
    ("spin", {"hostfunc_v2": False, "memops": False}, "blocking"),
)


def extension_names(mode: str | None = None) -> list[str]:
    """Every extension under test, or those that can run ``mode``."""
    extra = [n.strip() for n in os.environ.get(EXTRA_ENV, "").split(",") if n.strip()]
    names = EXTENSIONS + [n for n in extra if n not in EXTENSIONS]
    return [n for n in names if mode is None or mode in load(n).MODES]


def load(name: str) -> ModuleType:
    return importlib.import_module(name)


def sim_extension() -> ModuleType:
    """SimDevice, SimStream and SimGraph: built by editable installs only, never in the wheel."""
    try:
        return importlib.import_module(SIM_EXTENSION)
    except ImportError as e:
        raise RuntimeError(
            f"{SIM_EXTENSION} is missing: an editable install builds it (`make venv`, or "
            "`pip install -e .`); elsewhere build with FASTPATH_BUILD_SIM=ON"
        ) from e


def _short(name: str) -> str:
    return "native" if name == EXTENSIONS[0] else name.split(".")[0]


def mode_params(modes: tuple[str, ...] = ALL_MODES) -> list:
    """(extension name, mode) for every mode each extension can run."""
    params = []
    for name in extension_names():
        for mode in load(name).MODES:
            if mode in modes:
                params.append(pytest.param((name, mode), id=f"{_short(name)}-{mode}"))
    return params


def sim_params(backends: tuple[str, ...] | None = None) -> list:
    """(extension name, mode, SimDevice kwargs, expected backend) for the extension's modes."""
    params = []
    for name in extension_names():
        ext = load(name)
        for mode, device, backend in SIM_BACKENDS:
            if mode not in ext.MODES or (backends is not None and backend not in backends):
                continue
            if mode == "spin" and backend == "blocking" and ext.FIXED_ON_UNSUPPORTED == "error":
                continue  # that extension refuses this fall back (test_hostfunc_selection checks it)
            absent = "-".join(k for k, v in device.items() if not v) or "all"
            params.append(
                pytest.param((name, mode, device, backend), id=f"{_short(name)}-{mode}-{backend}-{absent}")
            )
    return params
