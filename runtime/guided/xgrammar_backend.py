"""xgrammar as a guided backend: constraints compiled to grammars, one matcher per request.

Its matchers can be driven by the dispatch extension's C++ fill (native_fill.py), which never takes
the GIL; MatcherCalls (matcher_calls.py) drives them from Python where that fill cannot be built.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .matcher_calls import MatcherCalls
from .spec import GrammarError, GuidedSpec

# xgrammar prefixes its errors with "[hh:mm:ss] /path/file.cc:line: "; the request is told the rest.
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


def first_line(exc: BaseException) -> str:
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return _LOG_PREFIX.sub("", line) or type(exc).__name__


def choice_grammar(source: str) -> str:
    """One of the strings, as EBNF: JSON string literals are xgrammar's literal syntax."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in json.loads(source))


class XGrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, threads: int = 2) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # xgrammar's own cache is unbounded by default; GrammarCache bounds ours by count.
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self.calls = MatcherCalls()

    def compile(self, spec: GuidedSpec) -> Any:
        c = self._compiler
        try:
            if spec.kind == "json_schema":
                # Compact JSON: a random-weight model may otherwise emit whitespace for ever.
                return c.compile_json_schema(spec.source, any_whitespace=False)
            if spec.kind == "json_object":
                return c.compile_builtin_json_grammar()
            if spec.kind == "regex":
                return c.compile_regex(spec.source)
            if spec.kind == "choice":
                return c.compile_grammar(choice_grammar(spec.source))
            return c.compile_grammar(spec.source)
        except Exception as exc:  # whatever the compiler raises is this request's error, not the engine's
            raise GrammarError(f"guided {spec.kind} does not compile: {first_line(exc)}") from None

    def matcher(self, grammar: Any) -> Any:
        return self._xgr.GrammarMatcher(grammar)
