"""The cases guided decoding is held to: a schema set (nested objects, arrays, enums, numbers, patterned
strings), the backends, choices, and hostile constraints."""

import importlib.util

import pytest

VOCAB = 512  # random:tiny-llama's

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 999},
                    "role": {"enum": ["admin", "dev", "ops"]},
                },
                "required": ["id", "role"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 1,
                "maxItems": 4,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    "number": {
        "type": "object",
        "properties": {"x": {"type": "number"}, "n": {"type": "integer"}},
        "required": ["x", "n"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        },
        "required": ["code", "name"],
        "additionalProperties": False,
    },
}

PROMPTS = ["The quick brown fox", '{"name": "fastpath"', "Decode steps replay CUDA graphs", "[1, 2, 3"]


def _backend(name):
    missing = importlib.util.find_spec(name) is None
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"{name} is not installed"), id=name)


# Every guided test that is not about one backend's internals runs once per backend.
BACKENDS = [_backend("xgrammar"), _backend("llguidance")]

CHOICES = ["red", "green light", 'say "hi"', "back\\slash", "café", "a|b(c)*"]


def deep(levels, leaf=1):
    """A dict nested `levels` deep, built without recursion."""
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def cyclic():
    value = {"type": "object"}
    value["properties"] = {"self": value}
    return value


# Constraints that are not JSON data, or not a constraint at all: ValueError from parse_spec.
MALFORMED = [
    ({"regex": "a", "grammar": "b"}, "exactly one of"),
    ({"json": {}}, "unknown constraint 'json'"),
    ({"json_object": "yes"}, "json_object must be True"),
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"json_schema": [1]}, "json_schema must be an object"),
    ({"regex": ""}, "regex must be a non-empty string"),
    ({"grammar": 5}, "grammar must be a non-empty string"),
    ("[a-z]", "must be a dict"),
    ({"choice": []}, "choice must be a non-empty list of strings"),
    ({"choice": "red"}, "choice must be a non-empty list of strings"),
    ({"choice": ["red", 3]}, "choice must hold non-empty strings, got 3"),
    ({"choice": ["red", ""]}, "choice must hold non-empty strings"),
    ({"json_schema": {1: {"type": "string"}}}, "has a key that is not a string: 1 at /"),
    ({"json_schema": {"properties": {1: {}, "b": {}}}}, "has a key that is not a string: 1 at /properties"),
    ({"json_schema": {"enum": {1, 2}}}, "holds a set at /enum"),
    ({"json_schema": {"const": b"x"}}, "holds a bytes at /const"),
    ({"json_schema": {"const": object()}}, "holds a object at /const"),
    ({"json_schema": {"maximum": float("nan")}}, "holds nan at /maximum, which JSON cannot encode"),
    ({"json_schema": {"maximum": float("inf")}}, "holds inf at /maximum"),
    ({"json_schema": deep(100_000)}, "nests deeper than 64 levels"),
    ({"json_schema": cyclic()}, "nests deeper than 64 levels"),
    ({"json_schema": "[" * 100_000 + "]" * 100_000}, "nests deeper than 64 levels"),
    ({"json_schema": '{"a":' * 100 + "1" + "}" * 100}, "nests deeper than 64 levels"),
    ({"json_schema": '{"maximum": NaN}'}, "holds nan at /maximum"),
    ({"json_schema": '{"a": 1' + "0" * 5000 + "}"}, "json_schema is not valid JSON"),
    (deep(100_000), "guided: unknown constraint 'a'"),
]

# Well-formed constraints that no backend compiles: each request's own GrammarError.
UNCOMPILABLE = [
    {"json_schema": {"type": 5}},
    {"json_schema": {"$ref": "#/nope"}},
    {"json_schema": {"type": "string", "pattern": "("}},
    {"json_schema": {"type": "integer", "minimum": "a"}},
    {"regex": "([a-z"},
    {"grammar": "root ::= ???"},
]
