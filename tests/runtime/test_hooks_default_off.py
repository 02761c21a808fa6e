"""Default-off proof: with every hook at its off value, no hook-reachable code runs outside its on-branch."""

from pathlib import Path

import pytest
from hook_proof import HOOKS, consumer_files, scan_source

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def test_native_consumers_use_hooks_only_inside_their_on_branches():
    files = consumer_files(RUNTIME)
    names = {f.name for f in files}
    assert "native_executor.py" in names, "the scan must never be empty"
    seen: set[str] = set()
    for path in files:
        reads, violations = scan_source(path.read_text(), str(path))
        assert not violations, "\n".join(map(str, violations))
        seen |= {hook for _, hook in reads}
    assert seen == set(HOOKS), f"every hook has a consumer; unread: {set(HOOKS) - seen}"


PLANTED = {
    "direct call": "def f(self, x):\n    self.hooks.decode_prologue(self, x)\n",
    "alias call": "def f(self, x):\n    p = self.hooks.decode_prologue\n    p(self, x)\n",
    "else branch": (
        "def f(self, x):\n    p = self.hooks.decode_prologue\n    if p is not None:\n        pass\n"
        "    else:\n        p(self, x)\n"
    ),
    "wrong guard": (
        "def f(self):\n    e = self.hooks.executor_events\n    if self.hooks.loop_on_execution_stream:\n"
        "        e.after_warmup(self)\n"
    ),
    "or instead of and": "def f(self, x):\n    p = self.hooks.decode_prologue\n    return p is None or p(self, x)\n",
    "passed along": "def f(self):\n    run(self.hooks.executor_events)\n",
    "after the guard": (
        "def f(self):\n    e = self.hooks.executor_events\n    if e is not None:\n        pass\n"
        "    e.at_shutdown(self)\n"
    ),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_the_walk_reports_planted_violations(name):
    _, violations = scan_source(PLANTED[name], name)
    assert violations, f"planted violation {name!r} was not reported"
    assert all(v.line >= 2 for v in violations)


GUARDED = {
    "if not None": "def f(self, x):\n    p = self.hooks.decode_prologue\n    if p is not None:\n        p(self, x)\n",
    "and": "def f(self, x):\n    p = self.hooks.decode_prologue\n    return p is not None and p(self, x)\n",
    "early return": (
        "def f(self):\n    e = self.hooks.executor_events\n    if e is None:\n        return\n    e.at_shutdown(self)\n"
    ),
    "bool flag": "def f(self):\n    if self.hooks.loop_on_execution_stream:\n        enter()\n",
}


@pytest.mark.parametrize("name", list(GUARDED))
def test_the_walk_accepts_guarded_uses(name):
    reads, violations = scan_source(GUARDED[name], name)
    assert reads and not violations
