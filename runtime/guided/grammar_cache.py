"""Compiled grammars, one per distinct constraint, kept in a bounded LRU."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .spec import GuidedSpec


class GrammarError(ValueError):
    """A constraint that does not compile (bad regex, bad EBNF, unsupported schema)."""


class GrammarCache:
    def __init__(self, tokenizer: Any, vocab_size: int, capacity: int = 64, threads: int = 2) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # xgrammar's own cache is unbounded by default; this one is bounded by count.
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self._capacity = capacity
        self._grammars: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.compilations = 0

    def __len__(self) -> int:
        return len(self._grammars)

    def get(self, spec: GuidedSpec) -> Any:
        grammar = self._grammars.get(spec.key)
        if grammar is not None:
            self._grammars.move_to_end(spec.key)
            return grammar
        grammar = self._compile(spec)
        self.compilations += 1
        self._grammars[spec.key] = grammar
        if len(self._grammars) > self._capacity:
            self._grammars.popitem(last=False)
        return grammar

    def _compile(self, spec: GuidedSpec) -> Any:
        c = self._compiler
        try:
            if spec.kind == "json_schema":
                # Compact JSON: a random-weight model may otherwise emit whitespace for ever.
                return c.compile_json_schema(spec.source, any_whitespace=False)
            if spec.kind == "json_object":
                return c.compile_builtin_json_grammar()
            if spec.kind == "regex":
                return c.compile_regex(spec.source)
            return c.compile_grammar(spec.source)
        except (RuntimeError, ValueError, TypeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise GrammarError(f"guided {spec.kind} does not compile: {first}") from None

    def matcher(self, spec: GuidedSpec) -> Any:
        return self._xgr.GrammarMatcher(self.get(spec))
