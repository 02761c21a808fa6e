"""Safe, bounded YAML with positions: what the loader accepts, what it refuses, and where it points."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastpath.schema import ManifestError, parse_manifest
from fastpath.schema.yaml_source import MAX_ALIAS_EXPANSIONS, read_yaml


def test_positions_of_keys_and_values_are_one_based():
    doc = read_yaml("a:\n  b: [1, 2]\n", "f")
    assert doc.keys[("a",)] == (1, 1) and doc.keys[("a", "b")] == (2, 3)
    assert doc.values[("a", "b")] == (2, 6) and doc.values[("a", "b", 1)] == (2, 10)


def test_only_yaml_1_2_booleans_and_decimal_integers():
    doc = read_yaml("a: [true, False, no, yes, on, 7, 0777, 0x1f, 1_000, 1:20, 2024-01-01, ~]", "f")
    assert doc.data["a"] == [
        True,
        False,
        "no",
        "yes",
        "on",
        7,
        "0777",
        "0x1f",
        "1_000",
        "1:20",
        "2024-01-01",
        None,
    ]


def test_a_few_aliases_are_fine():
    doc = read_yaml("a: &x [1, 2]\nb: *x\n", "f")
    assert doc.data == {"a": [1, 2], "b": [1, 2]}


def test_alias_expansion_is_bounded():
    uses = ", ".join(["*x"] * (MAX_ALIAS_EXPANSIONS + 1))
    with pytest.raises(ManifestError, match="alias bomb"):
        read_yaml(f"a: &x 1\nb: [{uses}]\n", "f")


def test_an_alias_that_contains_itself_is_refused():
    with pytest.raises(ManifestError, match="contains it"):
        read_yaml("a: &x [1, *x]\n", "f")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("a: 1\n---\nb: 2\n", "invalid YAML"),
        ("a: 1\na: 2\n", "duplicate key 'a'"),
        ("? [1]\n: 2\n", "plain string"),
        ("1: 2\n", "plain string"),
        ("base: &b {x: 1}\nother:\n  <<: *b\n", "merge keys"),
        ("a: !!binary aGk=\n", "not allowed"),
        ("a: !custom 1\n", "not allowed"),
        ("a: \x07\n", "invalid YAML"),
        ("a: " + "[" * 40 + "]" * 40 + "\n", "nested deeper"),
        ("a: " + "9" * 5000 + "\n", "cannot read value"),
    ],
)
def test_unsafe_or_malformed_yaml_is_refused(text, message):
    with pytest.raises(ManifestError, match=message):
        read_yaml(text, "f")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_either_loads_or_raises_a_manifest_error(text):
    try:
        parse_manifest(text, "hostile.yaml")
    except ManifestError as exc:
        for line in str(exc).splitlines():
            assert line.startswith("hostile.yaml:") and ": error: " in line
