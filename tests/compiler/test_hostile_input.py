"""Hostile strings in every string field: compile refuses the manifest, or the string lands as data only.

No manifest may inject code into generated Python, C++, CMake or TOML.
"""

import ast
import io
import json
import re
import tokenize

import pytest
import yaml
from compile_helpers import compile_text
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fastpath.schema import ManifestError

FRAGMENTS = [
    '"',
    "'",
    '"""',
    "'''",
    "\n",
    "\r",
    "\t",
    "\\",
    "\\n",
    "\x00",
    "\x1b",
    "é",
    "😀",
    "\u2028",
    "\ufeff",
    "{{ x }}",
    "{% if 1 %}",
    "{#",
    "#include <cstdlib>",
    "*/",
    "/*",
    "//",
    "${CMAKE_COMMAND}",
    "#[[",
    "]]",
    ")",
    "; import os",
    "__import__('os')",
    "$(rm -rf /)",
    "`",
    " ",
    ":",
    ".",
    "-",
    "random:",
]
SENTINEL = "qzxsentinel"  # lower case, so a hostile string can still be a valid name
hostile = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), min_size=1, max_size=6).map(
    lambda parts: SENTINEL + "".join(parts)
)

IDENTIFIER = r"[A-Za-z_]\w*"
IMPORT_PATH = rf"{IDENTIFIER}(\.{IDENTIFIER})*:{IDENTIFIER}"

BASE = {"schema_version": 1, "name": "hostile", "model": {"checkpoint": "random:tiny-llama"}}
FIELDS = {
    "name": lambda v: {"name": v},
    "checkpoint": lambda v: {"model": {"checkpoint": v}},
    "dtype": lambda v: {"model": {"checkpoint": "random:tiny-llama", "dtype": v}},
    "device": lambda v: {"runtime": {"device": v}},
    "cuda_graphs": lambda v: {"runtime": {"cuda_graphs": {"enabled": v}}},
    "decode_prologue": lambda v: {"hooks": {"decode_prologue": v}},
    "event": lambda v: {"hooks": {"executor_events": {"after_warmup": ["a:b", v]}}},
    "event_key": lambda v: {"hooks": {"executor_events": {v: ["a:b"]}}},
    "mode": lambda v: {"host_dispatch": {"mode": v}},
    "on_unsupported": lambda v: {"host_dispatch": {"on_unsupported": v}},
    "fmha": lambda v: {"fmha": {"prepend": [v]}},
    "backend": lambda v: {"guided_decoding": {"backend": v}},
    "top_key": lambda v: {v: 1},
}


def compile_or_refuse(data):
    text = yaml.safe_dump(data, allow_unicode=True)
    try:
        return compile_text(text)
    except ManifestError as exc:
        for diagnostic in exc.diagnostics:
            assert "\n" not in diagnostic.message and "\r" not in diagnostic.message
        return None


def python_outside_strings(source: str) -> str:
    """The module's tokens, without string literals and comments."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    kept = (t.string for t in tokens if t.type not in (tokenize.STRING, tokenize.COMMENT))
    return " ".join(kept)


def assert_data_only(value: str, files: dict[str, str]) -> None:
    for path, text in files.items():
        if path.endswith(".py"):
            compile(text, path, "exec")
            assert SENTINEL not in python_outside_strings(text), f"{path}: the string escaped its literal"
        elif path.endswith(".json"):
            json.loads(text)  # json.dumps escaped it; it must still parse
        else:  # C++, CMake, TOML carry no free text at all
            assert SENTINEL not in text, f"{path} holds manifest text"


@pytest.mark.parametrize("field", sorted(FIELDS))
@settings(max_examples=60, deadline=None)
@given(value=hostile)
@example(value=SENTINEL + ":A")  # a valid import path, which the hook fields accept (found by CI)
@example(value=SENTINEL + "\x85")  # NEL: a line break to YAML (found in a fresh clone's run)
def test_hostile_strings_are_refused_or_held_as_data(field, value):
    result = compile_or_refuse({**BASE, **FIELDS[field](value)})
    if result is None:
        return
    plan, files = result
    for path, text in files.items():
        if path.endswith(".py"):
            compile(text, path, "exec")
    if field in ("decode_prologue", "event"):  # an import path: dotted identifiers, a colon, an attribute
        assert re.fullmatch(IMPORT_PATH, value, re.ASCII), f"{field} accepted {value!r}"
        return
    if field != "checkpoint":  # only free text may hold more than an identifier
        assert re.fullmatch(r"[a-z0-9_-]+", value), f"{field} accepted {value!r}"
        return
    assert_data_only(value, files)
    package = plan.package
    init = ast.parse(files[f"{package}/__init__.py"])
    (defaults,) = [n.value for n in init.body if isinstance(n, ast.Assign) and n.targets[0].id == "DEFAULTS"]
    # What the manifest holds is what YAML reads back: a NEL (U+0085) that PyYAML's dumper writes
    # raw is a line break to its loader, folded to a space.
    held = yaml.safe_load(yaml.safe_dump(FIELDS[field](value), allow_unicode=True))["model"]["checkpoint"]
    assert ast.literal_eval(defaults)["model"] == held
    assert json.loads(files[f"{package}/manifest.lock.json"])["llm_kwargs"]["model"] == held


def test_a_checkpoint_full_of_quotes_and_braces_is_accepted_as_data():
    value = SENTINEL + "\"\"\"'''{{ x }}{% if %}#include <x>\\é😀 */ ${X} #[["
    plan, files = compile_text(yaml.safe_dump({**BASE, "model": {"checkpoint": value}}, allow_unicode=True))
    assert plan.model == value
    assert_data_only(value, files)


@pytest.mark.parametrize(
    "path",
    [
        'examples/"""quote.yaml',
        "examples/{{ x }}.yaml",
        "examples/x */ y.yaml",
        "examples/é😀.yaml",
        "examples/x # -*- coding: utf-7 -*-.yaml",
        "examples/x # vim: set fileencoding=latin-1 :.yaml",
    ],
)
def test_a_hostile_manifest_path_reaches_only_the_lock_file(path):
    _, files = compile_text(yaml.safe_dump(BASE), path)
    for file, text in files.items():
        if file.endswith(".json"):
            assert json.loads(text)["manifest"]["path"] == path
        else:
            assert path not in text, file
        if file.endswith(".py"):  # PEP 263: what makes Python re-encode a file
            assert not re.search(r"coding[:=]", "".join(text.splitlines(keepends=True)[:2])), file


def test_an_encoding_declaration_in_the_path_cannot_reencode_the_package():
    # Once, line 1 named the manifest's path: `coding:utf-7` there made Python decode the file as
    # UTF-7, and this checkpoint (UTF-7 for `"`, newline, `import os`, ...) ran code at import.
    # Python honours the declaration only when it reads bytes, so parse the files as bytes.
    payload = "+ACIACgBpAG0AcABvAHIAdAAgAG8AcwAKAHgAIAA9ACAAIg-"
    for checkpoint in (f"{SENTINEL}/{payload}", f"{SENTINEL}/café"):
        data = {**BASE, "model": {"checkpoint": checkpoint}}
        text = yaml.safe_dump(data, allow_unicode=True)
        plan, files = compile_text(text, "x # -*- coding: utf-7 -*-.yaml")
        for file, source in files.items():
            if file.endswith(".py"):
                tree = ast.parse(source.encode("utf-8"))
                imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
                assert "os" not in imported, file
        init = ast.parse(files[f"{plan.package}/__init__.py"].encode("utf-8"))
        (defaults,) = [
            n.value for n in init.body if isinstance(n, ast.Assign) and n.targets[0].id == "DEFAULTS"
        ]
        assert ast.literal_eval(defaults)["model"] == checkpoint  # café stays café
