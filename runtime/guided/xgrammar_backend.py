"""xgrammar as a guided backend: constraints compiled to grammars, one matcher per request.

Its matchers can be driven by the dispatch extension's C++ fill (native_fill.py), which never takes
the GIL; MatcherCalls (matcher_calls.py) drives them from Python where that fill cannot be built.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .lark_ebnf import to_ebnf
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
        if spec.whitespace_pattern is not None:
            raise GrammarError(
                "guided whitespace_pattern is not supported by xgrammar (it takes disable_any_whitespace); "
                "build the LLM with guided_backend='llguidance' for it"
            )
        source = to_ebnf(spec.source) if spec.kind == "grammar" else spec.source
        c = self._compiler
        try:
            if spec.kind in ("json_schema", "json_object"):
                # Compact JSON unless asked otherwise: a random-weight model may otherwise emit
                # whitespace for ever. json_object is vLLM's {"type": "object"}: an object, never
                # an array or a bare value as xgrammar's builtin JSON grammar allows.
                schema = source if spec.kind == "json_schema" else '{"type": "object"}'
                return c.compile_json_schema(schema, any_whitespace=spec.any_whitespace)
            if spec.kind == "regex":
                return c.compile_regex(source)
            if spec.kind == "choice":
                return c.compile_grammar(choice_grammar(source))
            if spec.kind == "structural_tag":
                return self._structural_tag(source)
            return c.compile_grammar(source)
        except Exception as exc:  # whatever the compiler raises is this request's error, not the engine's
            raise GrammarError(f"guided {spec.kind} does not compile: {first_line(exc)}") from None

    def _structural_tag(self, source: str) -> Any:
        """vLLM's structural tag: its older {"structures", "triggers"} form, or xgrammar's own."""
        tag = json.loads(source)
        if "structures" not in tag:
            return self._compiler.compile_structural_tag(source)
        try:
            items = [
                self._xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                for s in tag["structures"]
            ]
            triggers = list(tag["triggers"])
        except (KeyError, TypeError):
            raise ValueError(
                "its structures need begin, schema and end each, and it needs triggers"
            ) from None
        return self._compiler.compile_structural_tag(items, triggers)

    def matcher(self, grammar: Any) -> Any:
        return self._xgr.GrammarMatcher(grammar)
