"""The compiler's one bridge to the runtime: a manifest on the native engine, and what the runtime
offers on this machine (for --explain). Imports of fastpath.runtime happen inside the functions,
so `import fastpath.compiler` stays free of torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastpath.schema.loader import load_manifest, parse_manifest

from .plan import Plan
from .resolve import resolve


def native_llm(path: str | Path, **overrides: Any):
    """Run a manifest on the native engine, hooks imported at run time: the generated package's twin."""
    return _llm(resolve(load_manifest(Path(path))), overrides)


def native_llm_from_text(text: str, **overrides: Any):
    """native_llm for a manifest held in a string."""
    return _llm(resolve(parse_manifest(text, "<manifest>")), overrides)


def _llm(plan: Plan, overrides: dict[str, Any]):
    from fastpath.runtime import LLM

    return LLM.from_lock(plan.to_json(), **overrides)


def runtime_availability(plan: Plan) -> dict[str, list[str]] | str:
    """Ask fastpath's runtime (which imports torch) which FMHA libraries would load here."""
    try:
        import torch

        from fastpath.runtime.attention.registry import availability_report
    except Exception as exc:  # no torch, or a runtime that does not import: say so and carry on
        return f"runtime not importable ({type(exc).__name__}: {exc})"
    device = {} if plan.device == "auto" else {"device_type": plan.device}
    try:
        return availability_report(list(plan.fmha_order), dtype=getattr(torch, plan.dtype), **device)
    except Exception as exc:
        return f"availability unknown ({type(exc).__name__}: {exc})"
