"""Python literals for generated code: exact round trips, and the spelling ruff format keeps."""

import ast
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastpath.compiler.literals import py_literal

REPO = Path(__file__).resolve().parents[2]
scalars = st.none() | st.booleans() | st.integers() | st.text()
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_every_literal_evaluates_to_its_value(value):
    source = py_literal(value, 4)
    assert ast.literal_eval(source) == value
    assert type(ast.literal_eval(source)) is type(value)


@pytest.mark.parametrize(
    ("value", "source"),
    [
        ("plain", '"plain"'),
        ("it's", '"it\'s"'),
        ('say "hi"', "'say \"hi\"'"),
        ('"""', '\'"""\''),
        ("a\\b\nc\x00", '"a\\\\b\\nc\\x00"'),
        ("{{ x }} {% y %}", '"{{ x }} {% y %}"'),
        (("one",), '("one",)'),
        ((), "()"),
        ([1, 2], "[1, 2]"),
    ],
)
def test_spelling(value, source):
    assert py_literal(value) == source


def test_unsupported_values_are_refused():
    for bad in [float("nan"), {1: 2}, {"a"}, object()]:
        with pytest.raises((TypeError, ValueError)):
            py_literal(bad)


def test_ruff_format_leaves_the_literals_as_written(tmp_path):
    ruff = shutil.which("ruff") or str(Path(REPO, ".venv/bin/ruff"))
    samples = {
        "SHORT": (1, 2, 4),
        "LONG": tuple(f"library_{i}" for i in range(8)),
        "ONE": ("x",),
        "NESTED": {"a": ["b" * 50, "c"], "d": {"e": None, "f": ("g",)}, "h": 'q"uote'},
    }
    module = "".join(f"{k} = {py_literal(v)}\n" for k, v in samples.items())
    module += "\n\nclass C:\n" + "".join(f"    {k} = {py_literal(v, 4)}\n" for k, v in samples.items())
    source = tmp_path / "sample.py"
    source.write_text(module, encoding="utf-8")
    done = subprocess.run(
        [ruff, "format", "--diff", "--config", str(REPO / "pyproject.toml"), str(source)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
