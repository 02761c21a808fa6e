"""DESIGN.md's default-off proof for generated code: a hook the Plan leaves off is not named in any
generated Python module, not as a name, an attribute, an import, an argument or a string."""

import ast

import pytest
from compile_helpers import ALL_HOOKS, EXAMPLES, compile_text

HOOK_NAMES = {
    "loop_on_execution_stream": lambda h: h.loop_on_execution_stream,
    "decode_prologue": lambda h: h.decode_prologue is not None,
    "executor_events": lambda h: any(h.executor_events().values()),
    "after_warmup": lambda h: bool(h.after_warmup),
    "before_overlap_loop": lambda h: bool(h.before_overlap_loop),
    "at_shutdown": lambda h: bool(h.at_shutdown),
}


def names_in(source: str) -> set[str]:
    """Every identifier and every string constant of a module."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            found.add(node.arg)
        elif isinstance(node, ast.alias):
            found.update(node.name.split(".") + ([node.asname] if node.asname else []))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(node.module.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def hooks_named(source: str, off: set[str]) -> set[str]:
    names = names_in(source)
    return {hook for hook in off if any(hook in name for name in names)}


def off_hooks(plan) -> set[str]:
    return {name for name, is_on in HOOK_NAMES.items() if not is_on(plan.hooks)}


MANIFESTS = {e.stem: e.read_text() for e in EXAMPLES} | {
    "all-hooks": ALL_HOOKS,
    "only-shutdown": "schema_version: 1\nname: s\nmodel: {checkpoint: 'random:tiny-llama'}\n"
    "hooks: {executor_events: {at_shutdown: ['a:b']}}\n",
}


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_no_generated_module_names_a_hook_the_plan_left_off(name):
    plan, files = compile_text(MANIFESTS[name])
    off = off_hooks(plan)
    for path, text in files.items():
        if path.endswith(".py"):
            assert not hooks_named(text, off), f"{path} names hooks that are off: {hooks_named(text, off)}"


def test_the_walk_catches_planted_references():
    off = set(HOOK_NAMES)
    planted = {
        "self.decode_prologue(x)": "decode_prologue",
        "if hooks.loop_on_execution_stream:\n    pass": "loop_on_execution_stream",
        "from a.after_warmup import b": "after_warmup",
        "from a import at_shutdown as f": "at_shutdown",
        "f(before_overlap_loop=1)": "before_overlap_loop",
        "x = {'executor_events': []}": "executor_events",
        "def f(decode_prologue): pass": "decode_prologue",
    }
    for source, hook in planted.items():
        assert hook in hooks_named(source, off), source
    assert not hooks_named("x = 1\nclass Executor: pass", off)
