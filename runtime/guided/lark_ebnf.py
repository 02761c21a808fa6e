"""Lark grammars for xgrammar, which reads only its EBNF: the common subset of Lark, converted.

llguidance reads Lark itself; vLLM converts it for xgrammar as this does. The subset: rules and
terminals `name: alternatives` (the `?` and `!` before a name shape Lark's parse tree only, and are
dropped), `|` (also leading a continuation line), "strings", "a".."z" ranges, /regex/ (xgrammar's
Regex("...")), `?` `*` `+` `~n` `~n..m`, [optional], parentheses, `-> alias` (tree shaping: dropped)
and // comments; `start` is the root. Anything else (%import, %ignore, priorities, templates, flags)
is a GrammarError that says to use llguidance, which runs all of Lark.
"""

from __future__ import annotations

import ast
import json
import re
import warnings

from .spec import GrammarError

# xgrammar's rules read `name ::= ...`; Lark's `name: ...`.
_EBNF_RULE = re.compile(r"^\s*[A-Za-z_][\w-]*\s*::=", re.MULTILINE)
_TOKEN = re.compile(
    r"""(?P<space>[ \t\r]+) | (?P<comment>//[^\n]*) | (?P<newline>\n)
    | (?P<string>"(?:\\.|[^"\\\n])*"[a-z]*) | (?P<regex>/(?:\\.|[^/\\\n])+/[a-z]*)
    | (?P<name>[A-Za-z_]\w*) | (?P<number>[0-9]+) | (?P<op>\.\.|->|[:|()\[\]?*+~!])""",
    re.VERBOSE,
)
_DIRECTIVE = re.compile(r"%\w*")
_NESTING = 64  # parentheses and brackets deep: far past real grammars, inside Python's recursion limit


def is_ebnf(grammar: str) -> bool:
    """Whether a grammar is EBNF (GBNF): a rule reads `name ::= ...`; anything else is taken for Lark."""
    return _EBNF_RULE.search(grammar) is not None


def to_ebnf(grammar: str) -> str:
    """xgrammar's EBNF for a grammar: itself when it is EBNF already, else converted from Lark."""
    return grammar if is_ebnf(grammar) else lark_to_ebnf(grammar)


def lark_to_ebnf(grammar: str) -> str:
    """The subset of Lark the module docstring lists -> xgrammar EBNF with `start` as `root`."""
    rules: dict[str, str] = {}
    lines = _logical_lines(_tokens(grammar))
    names = {line[_name_at(line)][1] for line in lines if _name_at(line) is not None}
    for line in lines:
        at = _name_at(line)
        if at is None or len(line) < at + 2 or line[at + 1][1] != ":":
            raise _error(f"expected a rule `name: ...` at line {line[0][2]}")
        name = _rename(line[at][1], names)
        if name in rules:
            raise _error(f"{line[at][1]!r} is defined twice")
        rules[name] = _Body(line[at + 2 :], names, line[0][2]).parse()
    if "root" not in rules:
        raise _error("no `start` rule")
    return "\n".join(
        f"{name} ::= {body}" for name, body in sorted(rules.items(), key=lambda r: r[0] != "root")
    )


def _error(message: str) -> GrammarError:
    return GrammarError(
        f"guided grammar: {message}: xgrammar runs a subset of Lark; for the rest, use the llguidance "
        "backend (LLM(..., guided_backend='llguidance'))"
    )


def _tokens(grammar: str) -> list[tuple[str, str, int]]:
    """(kind, text, line) for each token; spaces and comments dropped."""
    out, pos, line = [], 0, 1
    while pos < len(grammar):
        m = _TOKEN.match(grammar, pos)
        if m is None:
            directive = _DIRECTIVE.match(grammar, pos)
            what = directive.group() if directive and len(directive.group()) > 1 else grammar[pos]
            raise _error(f"{what!r} at line {line}")
        kind = m.lastgroup
        if kind not in ("space", "comment"):
            out.append((kind, m.group(), line))
        line += kind == "newline"
        pos = m.end()
    return out


def _logical_lines(tokens: list[tuple[str, str, int]]) -> list[list[tuple[str, str, int]]]:
    """A definition per line; a line that starts with `|` goes on with the one before."""
    lines: list[list[tuple[str, str, int]]] = []
    current: list[tuple[str, str, int]] = []
    for token in [*tokens, ("newline", "\n", 0)]:
        if token[0] != "newline":
            current.append(token)
            continue
        if current and current[0][1] == "|" and lines:
            lines[-1] += current
        elif current:
            lines.append(current)
        current = []
    return lines


def _name_at(line: list[tuple[str, str, int]]) -> int | None:
    """Where a definition's name is: after a `?` or `!`, which only shape Lark's parse tree."""
    at = 1 if line[0][1] in ("?", "!") else 0
    return at if len(line) > at and line[at][0] == "name" else None


def _rename(name: str, names: set[str]) -> str:
    """Lark's root is `start`; a Lark rule named `root` moves aside for it."""
    if name == "start":
        return "root"
    if name != "root":
        return name
    while name in names or name == "root":
        name += "_"
    return name


class _Body:
    """One definition's alternatives, parsed by recursive descent and written as EBNF."""

    def __init__(self, tokens: list[tuple[str, str, int]], names: set[str], line: int) -> None:
        self.tokens, self.names, self.line, self.pos, self.depth = tokens, names, line, 0, 0

    def parse(self) -> str:
        body = self.alternatives()
        if self.pos < len(self.tokens):
            self.unexpected()
        return body

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self, kind: str | None = None, text: str | None = None) -> str:
        token = self.tokens[self.pos] if self.pos < len(self.tokens) else None
        if token is None or (kind and token[0] != kind) or (text and token[1] != text):
            self.unexpected()
        self.pos += 1
        return token[1]

    def unexpected(self):
        where = f"{self.peek()!r}" if self.peek() is not None else "end of rule"
        raise _error(f"unexpected {where} at line {self.line}")

    def alternatives(self) -> str:
        alts = [self.alias()]
        while self.peek() == "|":
            self.take()
            alts.append(self.alias())
        return " | ".join(alts)

    def alias(self) -> str:
        items = []
        while self.peek() not in (None, "|", ")", "]", "->"):
            items.append(self.item())
        if self.peek() == "->":  # names the alternative's tree node; the language is the same
            self.take()
            self.take("name")
        return " ".join(items) or '""'

    def item(self) -> str:
        atom = self.atom()
        op = self.peek()
        if op in ("?", "*", "+"):
            return atom + self.take()
        if op != "~":
            return atom
        self.take()
        low = self.take("number")
        if self.peek() != "..":
            return f"{atom}{{{low}}}"
        self.take()
        return f"{atom}{{{low},{self.take('number')}}}"

    def atom(self) -> str:
        kind, text = self.tokens[self.pos][:2] if self.pos < len(self.tokens) else (None, None)
        if text in ("(", "["):
            self.depth += 1
            if self.depth > _NESTING:
                raise _error(f"parentheses nest deeper than {_NESTING} at line {self.line}")
            self.take()
            inner = self.alternatives()
            self.take(text="]" if text == "[" else ")")
            self.depth -= 1
            return f"({inner})" + ("?" if text == "[" else "")
        if kind == "name":
            return _rename(self.take(), self.names)
        if kind == "regex":
            return self.regex(self.take())
        if kind != "string":
            self.unexpected()
        first = self.string(self.take())
        if self.peek() != "..":
            return json.dumps(first, ensure_ascii=False)
        self.take()
        last = self.string(self.take("string"))
        if len(first) != 1 or len(last) != 1:
            raise _error(f'a range "a".."z" takes one character at each end, at line {self.line}')
        return f"[{_class_char(first)}-{_class_char(last)}]"

    def string(self, token: str) -> str:
        body, flags = token.rsplit('"', 1)
        if flags:
            raise _error(f"the string flag {flags!r} at line {self.line}")
        with warnings.catch_warnings():  # an unknown escape stays as written, as Lark reads it
            warnings.simplefilter("ignore")
            try:
                return ast.literal_eval(body + '"')
            except (SyntaxError, ValueError):
                raise _error(f"the string {token} at line {self.line} does not parse") from None

    def regex(self, token: str) -> str:
        body, flags = token[1:].rsplit("/", 1)
        if flags:
            raise _error(f"the regex flag {flags!r} at line {self.line}")
        return f"Regex({json.dumps(body.replace(chr(92) + '/', '/'), ensure_ascii=False)})"


def _class_char(c: str) -> str:
    """One character inside an EBNF [class]."""
    if c in "\\]^-[":
        return "\\" + c
    return f"\\x{ord(c):02x}" if ord(c) < 0x20 else c
