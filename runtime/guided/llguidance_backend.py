"""llguidance as a guided backend: constraints compiled to llguidance grammars, one matcher per request.

Each compiled constraint is kept as a matcher in its start state; a request gets a deep copy (cheap,
no recompilation). Its bitmask has xgrammar's layout (int32 words of 32 tokens, bit set = allowed),
so the decoder's buffers and `apply` serve both. The fill runs through llguidance's own parallel
call, which computes every row off the GIL: one GIL release per step, not one per row.
"""

from __future__ import annotations

import json
from typing import Any

from .lark_ebnf import is_ebnf
from .matcher_calls import usable_cpus
from .spec import GrammarError, GuidedSpec

# xgrammar's JSON without free whitespace (unless a request asks for it): a random-weight model may
# otherwise emit whitespace for ever, and either backend gives the same text for a schema.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class LLGuidanceCalls:
    """accept / terminated / fill over llguidance matchers (python_fill.PythonRow's interface)."""

    holds_gil = False  # llguidance's fill releases the GIL once per call, by its own choice

    def __init__(self, eos_ids: list[int], threads: int | str = "auto") -> None:
        import llguidance

        # "auto": one thread is the callback's own; leave one more for the engine's thread.
        self.threads = max(1, min(8, usable_cpus() - 2)) if threads == "auto" else int(threads)
        self._executor = llguidance.LLExecutor(self.threads)
        self._eos = frozenset(eos_ids)

    def accept(self, matcher: Any, token: int) -> bool:
        return matcher.consume_token(token)

    def terminated(self, matcher: Any, token: int) -> bool:
        """llguidance stays "stopped" before and after the end token: it is the token that ends a row."""
        return token in self._eos

    def fill(self, matchers: list[Any], bitmask: Any, rows: list[int]) -> None:
        from llguidance.numpy import fill_next_token_bitmask_par

        fill_next_token_bitmask_par(self._executor, list(zip(matchers, rows, strict=True)), bitmask)


class LLGuidanceBackend:
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        self.vocab_size = vocab_size
        try:
            self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        except ValueError as exc:
            raise ValueError(
                f"guided_backend='llguidance': {exc} (this tokenizer is not a fast one)"
            ) from None
        self.calls = LLGuidanceCalls(
            getattr(self.tokenizer, "eos_tokens", None) or [self.tokenizer.eos_token]
        )

    def _grammar(self, spec: GuidedSpec) -> str:
        llg = self._llg
        if spec.kind in ("json_schema", "json_object"):
            schema = spec.source if spec.kind == "json_schema" else '{"type":"object"}'
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=_json_options(spec))
        if spec.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(spec.source)
        if spec.kind == "structural_tag":
            return llg.grammar_from("lark", _structural_tag(llg, spec.source))
        if spec.kind == "grammar" and not is_ebnf(spec.source):
            # llguidance's own test for Lark is a line `start:`; `?start:` is Lark too.
            return llg.grammar_from("lark", spec.source)
        return llg.grammar_from(spec.kind, spec.source)  # choice: its JSON list; grammar: GBNF

    def compile(self, spec: GuidedSpec) -> Any:
        """A matcher in its start state; the matcher records a bad grammar instead of raising."""
        try:
            matcher = self._llg.LLMatcher(self.tokenizer, self._grammar(spec), log_level=0)
            error = matcher.get_error() if matcher.is_error() else None
        except Exception as exc:  # whatever the compiler raises is this request's error, not the engine's
            error = str(exc) or type(exc).__name__
        if error is not None:
            raise GrammarError(f"guided {spec.kind} does not compile: {_summary(error)}")
        return matcher

    def matcher(self, grammar: Any) -> Any:
        return grammar.deep_copy()


def _json_options(spec: GuidedSpec) -> dict[str, Any]:
    if spec.whitespace_pattern is not None:  # the pattern is all the whitespace: bare separators
        return {"whitespace_pattern": spec.whitespace_pattern, "item_separator": ",", "key_separator": ":"}
    return {"whitespace_flexible": True} if spec.any_whitespace else _JSON_OPTIONS


def _structural_tag(llg: Any, source: str) -> str:
    """vLLM's structural tag, as vLLM gives it to llguidance: its {"structures", "triggers"} form."""
    tag = json.loads(source)
    if "structures" not in tag:
        raise ValueError("llguidance takes the {'structures', 'triggers'} form; xgrammar takes both")
    try:
        tags = [
            llg.StructTag(
                trigger=next(t for t in tag["triggers"] if s["begin"].startswith(t)),
                begin=s["begin"],
                grammar=s["schema"],
                end=s["end"],
            )
            for s in tag["structures"]
        ]
    except StopIteration:
        raise ValueError("each structure's begin must start with one of its triggers") from None
    except (KeyError, TypeError, AttributeError):
        raise ValueError("its structures need begin, schema and end each, and it needs triggers") from None
    return llg.StructTag.to_grammar(tags)


def _summary(error: str) -> str:
    """llguidance's first line, and the cause it gives below a source excerpt ("error: ...")."""
    lines = [line.strip() for line in error.strip().splitlines()] or ["unknown error"]
    causes = [line for line in lines[1:] if line.startswith("error:")]
    return " ".join(lines[:1] + causes[:1])
