"""The default-off proof: an AST walk showing no hook value is used outside the branch its guard opens.

A *hook read* is an attribute `<...>.hooks.<name>` (or `hooks.<name>`) for a RuntimeHooks field.
A read may appear in a guard test, or be bound to a local name. Every other use of the read or of
such a local must sit where the hook's off value (False / None) cannot reach:
  - inside `if <guard>:` (the branch taken only when the hook is on),
  - after `if <off-guard>: return|raise|continue|break` in the same block,
  - on the right of `<guard> and ...`, or in the true arm of `... if <guard> else ...`.
A guard is the hook (or its local) tested for truth or `is not None`; an off-guard is its negation
(`not x`, `x is None`). Anything else is a violation, reported with its line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

HOOKS = ("loop_on_execution_stream", "decode_prologue", "executor_events")


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    hook: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.hook} used outside its on-branch: {self.code}"


def _hook_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr in HOOKS:
        base = node.value
        if (isinstance(base, ast.Attribute) and base.attr == "hooks") or (
            isinstance(base, ast.Name) and base.id == "hooks"
        ):
            return node.attr
    return None


def _is_none_test(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], (ast.Is, ast.IsNot))
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    )


class _Scan:
    def __init__(self, file: str, source: str) -> None:
        self.file, self.source = file, source
        self.reads: list[tuple[int, str]] = []
        self.violations: list[Violation] = []

    def hook_in(self, node: ast.AST, locals_: dict[str, str]) -> str | None:
        if (h := _hook_of(node)) is not None:
            return h
        if isinstance(node, ast.Name) and node.id in locals_:
            return locals_[node.id]
        return None

    def guard(self, test: ast.AST, locals_: dict[str, str]) -> tuple[str | None, bool]:
        """(hook, True) for an on-guard, (hook, False) for an off-guard, (None, _) otherwise."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            h, on = self.guard(test.operand, locals_)
            return h, not on
        if _is_none_test(test) and (h := self.hook_in(test.left, locals_)):
            return h, isinstance(test.ops[0], ast.IsNot)
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            for v in test.values:
                h, on = self.guard(v, locals_)
                if h and on:
                    return h, True
        h = self.hook_in(test, locals_)
        return (h, True) if h else (None, True)

    def check_expr(self, node: ast.AST, locals_: dict[str, str], on: frozenset[str]) -> None:
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            opened = set(on)
            for v in node.values:
                self.check_expr(v, locals_, frozenset(opened))
                h, is_on = self.guard(v, locals_)
                if h and is_on:
                    opened.add(h)
            return
        if isinstance(node, ast.IfExp):
            h, is_on = self.guard(node.test, locals_)
            self.check_guard_test(node.test, locals_, on)
            self.check_expr(node.body, locals_, on | {h} if h and is_on else on)
            self.check_expr(node.orelse, locals_, on | {h} if h and not is_on else on)
            return
        if self.guard(node, locals_)[0] is not None and self._is_pure_test(node, locals_):
            self.check_guard_test(node, locals_, on)
            return
        h = self.hook_in(node, locals_)
        if h is not None:
            if _hook_of(node):
                self.reads.append((node.lineno, h))
            if h not in on:
                self.violations.append(
                    Violation(self.file, node.lineno, h, ast.get_source_segment(self.source, node))
                )
            return
        for child in ast.iter_child_nodes(node):
            self.check_expr(child, locals_, on)

    def _is_pure_test(self, node: ast.AST, locals_) -> bool:
        if isinstance(node, ast.Compare):
            return True
        return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)

    def check_guard_test(self, test: ast.AST, locals_, on) -> None:
        """A guard may read the hook; record the read but allow it."""
        for n in ast.walk(test):
            if (h := _hook_of(n)) is not None:
                self.reads.append((n.lineno, h))

    def block(self, stmts: list[ast.stmt], locals_: dict[str, str], on: frozenset[str]) -> None:
        on = frozenset(on)
        for stmt in stmts:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                h = _hook_of(stmt.value)
                if h is not None:
                    locals_[stmt.targets[0].id] = h
                    self.reads.append((stmt.value.lineno, h))
                    continue
            if isinstance(stmt, ast.If):
                h, is_on = self.guard(stmt.test, locals_)
                self.check_guard_test(stmt.test, locals_, on)
                if not h:
                    self.check_expr(stmt.test, locals_, on)
                self.block(stmt.body, dict(locals_), on | {h} if h and is_on else on)
                self.block(stmt.orelse, dict(locals_), on | {h} if h and not is_on else on)
                if (
                    h
                    and not is_on
                    and stmt.body
                    and isinstance(stmt.body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))
                ):
                    on = on | {h}  # early exit when off: the rest of the block runs only when on
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.block(stmt.body, {}, frozenset())
                continue
            if isinstance(stmt, ast.ClassDef):
                self.block(stmt.body, {}, frozenset())
                continue
            nested = [f for f in ("body", "orelse", "finalbody", "handlers") if hasattr(stmt, f)]
            if nested:
                for field in ast.iter_fields(stmt):
                    name, value = field
                    if name in ("body", "orelse", "finalbody"):
                        self.block(value, locals_, on)
                    elif name == "handlers":
                        for handler in value:
                            self.block(handler.body, locals_, on)
                    elif isinstance(value, ast.AST):
                        self.check_expr(value, locals_, on)
                    elif isinstance(value, list):
                        for v in value:
                            if isinstance(v, ast.AST):
                                self.check_expr(v, locals_, on)
                continue
            self.check_expr(stmt, locals_, on)


def scan_source(source: str, file: str = "<source>") -> tuple[list[tuple[int, str]], list[Violation]]:
    scan = _Scan(file, source)
    scan.block(ast.parse(source).body, {}, frozenset())
    return scan.reads, scan.violations


def consumer_files(root: Path) -> list[Path]:
    """Every runtime file that reads a hook, except the module defining them."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "hooks.py":
            continue
        reads, _ = scan_source(path.read_text(), str(path))
        if reads:
            out.append(path)
    return out
