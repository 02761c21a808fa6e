"""Chooses the attention library for each call: the first in precedence that is available and supports it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .library import FmhaLibrary, KernelRefused
from .metadata import AttentionConfig, AttentionShapes
from .registry import DEFAULT_ORDER, create

log = logging.getLogger("fastpath.attention")


class NoAttentionLibrary(RuntimeError):
    pass


class FmhaManager:
    def __init__(
        self, cfg: AttentionConfig, enabled: Sequence[str] | None = None, prepend: Sequence[str] = ()
    ) -> None:
        # Prepended libraries are tried first; a name in both lists keeps its prepended place.
        order = list(prepend) + [
            n for n in (enabled if enabled is not None else DEFAULT_ORDER) if n not in prepend
        ]
        self.order: tuple[str, ...] = tuple(order)
        self.prepended: tuple[str, ...] = tuple(prepend)
        self.cfg = cfg
        self.available: dict[str, FmhaLibrary] = {}
        self.unavailable: dict[str, list[str]] = {}
        for name in self.order:
            lib = create(name)
            reasons = lib.is_available(cfg)
            if reasons:
                self.unavailable[name] = reasons
            else:
                self.available[name] = lib
        if not self.available:
            raise NoAttentionLibrary(f"no attention library is available: {self._format(self.unavailable)}")
        self._chosen: dict[AttentionShapes, FmhaLibrary] = {}
        self.rejections: dict[AttentionShapes, dict[str, list[str]]] = {}
        self.refusals: dict[str, str] = {}

    def select(self, shapes: AttentionShapes) -> FmhaLibrary:
        lib = self._chosen.get(shapes)
        if lib is not None:
            return lib
        rejected: dict[str, list[str]] = {}
        for name in self.order:
            if name in self.unavailable:
                rejected[name] = self.unavailable[name]
                continue
            reasons = self.available[name].supports(shapes)
            if not reasons:
                self._chosen[shapes] = self.available[name]
                self.rejections[shapes] = rejected
                log.info(
                    "attention %s: %s (skipped %s)", _describe(shapes), name, self._format(rejected) or "none"
                )
                return self.available[name]
            rejected[name] = reasons
        raise NoAttentionLibrary(
            f"no attention library supports {_describe(shapes)}: {self._format(rejected)}"
        )

    def batched_prefill(self) -> bool:
        """Whether a prefill step's attention is one launch for all its sequences (then a step may mix
        decoding sequences into a prefill cheaply)."""
        shapes = AttentionShapes("prefill", self.cfg.sliding_window is not None, True, False)
        try:
            return self.select(shapes).batched_prefill
        except NoAttentionLibrary:
            return False

    def forward(self, shapes: AttentionShapes, q, k_cache, v_cache, meta, scale):
        """Attention through the selected library; a kernel that refuses this call hands it to the next one."""
        lib = self.select(shapes)
        try:
            return lib.forward(q, k_cache, v_cache, meta, scale)
        except KernelRefused as exc:
            if shapes.capturing:
                raise
            self.refusals[lib.name] = str(exc)
            log.info(
                "attention %s: %s refused (%s); trying the next library", _describe(shapes), lib.name, exc
            )
            start = self.order.index(lib.name) + 1
            for name in self.order[start:]:
                other = self.available.get(name)
                if other is not None and not other.supports(shapes):
                    try:
                        return other.forward(q, k_cache, v_cache, meta, scale)
                    except KernelRefused as again:
                        self.refusals[name] = str(again)
            raise NoAttentionLibrary(f"every library refused {_describe(shapes)}: {self.refusals}") from exc

    def explain(self) -> list[str]:
        lines = [f"order: {', '.join(self.order)}"]
        for name in self.order:
            status = (
                "available" if name in self.available else "unavailable: " + "; ".join(self.unavailable[name])
            )
            lines.append(f"  {name}: {status}")
        for shapes, lib in self._chosen.items():
            lines.append(f"  {_describe(shapes)} -> {lib.name}")
        return lines

    @staticmethod
    def _format(reasons: dict[str, list[str]]) -> str:
        return "; ".join(f"{n}: {', '.join(r)}" for n, r in reasons.items())


def _describe(shapes: AttentionShapes) -> str:
    flags = [f for f in ("needs_mask", "chunked", "capturing") if getattr(shapes, f)]
    return shapes.phase + (f"[{','.join(flags)}]" if flags else "")
