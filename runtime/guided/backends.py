"""Which guided-decoding backend an engine uses: "auto" takes the first one installed and says so once.

The engine calls `resolve_backend` at construction, so its config names a backend, never "auto";
`make_backend` then builds that backend for the model's tokenizer.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from typing import Any

from fastpath.vocab import GUIDED_BACKENDS
from fastpath.vocab import install_line as vocab_install_line

log = logging.getLogger("fastpath.guided")

PREFERENCE = ("xgrammar", "llguidance")  # what "auto" tries, in order
NAMES = ("auto", *GUIDED_BACKENDS)
_announced: set[str] = set()  # backends said in this process: "auto" and then its pick say it once


def install_line() -> str:
    """The pip line that installs the guided backends with this package."""
    return vocab_install_line("guided")


def check_name(name: Any) -> str:
    if name not in NAMES:
        raise ValueError(f"guided_backend: {name!r} is not one of {', '.join(NAMES)}")
    return name


def importable(module: str) -> str | None:
    """None when `module` imports here, else why not."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # a broken install fails in many ways; "auto" must survive each
        return f"{type(exc).__name__}: {exc}"
    return None


def resolve_backend(name: str, *, has_tokenizer: bool, tensor_parallel_size: int = 1) -> tuple[str, str]:
    """(backend, reason): the backend an engine built with `guided_backend=name` uses, and why.

    "auto" never fails: it gives "none" (with the reason) when nothing is installed, the model has
    no tokenizer, or the engine is tensor-parallel. A backend named outright that cannot run here
    raises ValueError instead.
    """
    check_name(name)
    if name == "none":
        return "none", (
            "the engine was built with guided_backend='none'; build it with guided_backend='auto' "
            f"and xgrammar or llguidance installed ({install_line()})"
        )
    unusable = _unusable(has_tokenizer, tensor_parallel_size)
    if name != "auto":
        missing = importable(name)
        if missing is not None:
            raise ValueError(f"guided_backend={name!r}: {name} does not import ({missing}); {install_line()}")
        if unusable is not None:
            raise ValueError(f"guided_backend={name!r}: {unusable}")
        return _announce(name, "named by guided_backend")
    if unusable is not None:
        return "none", unusable  # silently: this engine cannot guide, whatever is installed
    for candidate in PREFERENCE:
        if importable(candidate) is None:
            return _announce(candidate, "auto: the first of xgrammar, llguidance that is installed")
    return _announce("none", f"neither xgrammar nor llguidance is installed: {install_line()}")


def _unusable(has_tokenizer: bool, tensor_parallel_size: int) -> str | None:
    if not has_tokenizer:
        return "guided decoding needs the model's tokenizer, and this model has none"
    if tensor_parallel_size > 1:
        return "guided decoding with tensor_parallel_size > 1 is not supported yet"
    return None


def _announce(backend: str, reason: str) -> tuple[str, str]:
    if backend not in _announced:
        _announced.add(backend)
        log.info("guided decoding: %s (%s)", backend, reason)
    return backend, reason


def off_message(reason: str) -> str:
    """What a guided request on an engine without a backend is told."""
    return f"guided decoding is off in this engine: {reason}"


def make_backend(name: str, tokenizer: Any, vocab_size: int) -> Any:
    """The compiler and matcher calls of backend `name` for this tokenizer."""
    if name == "xgrammar":
        from .xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size)
    if name == "llguidance":
        from .llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(tokenizer, vocab_size)
    raise ValueError(f"guided_backend: {name!r} is not a backend ({', '.join(PREFERENCE)})")
