"""A hook whose definition cannot take the executor's call is a manifest error at its line, found from
its source at compile time (never imported); what the source cannot tell is taken on trust."""

import sys
import textwrap

import pytest

from fastpath.compiler import hook_calls
from fastpath.compiler.resolve import resolve
from fastpath.schema import ManifestError, parse_manifest

HEAD = "schema_version: 1\nname: m\nmodel:\n  checkpoint: random:tiny-llama\nhooks:\n"

SOURCE = """
import functools

def event(executor): ...
def event_with_options(executor, verbose=False, *rest): ...
def prologue_fn(executor, inputs): ...
def no_args(): ...
def needs_keyword(executor, *, level): ...

class Prologue:
    def __call__(self, executor, inputs): ...

class PrologueNeedsConfig:
    def __init__(self, config): ...
    def __call__(self, executor, inputs): ...

class PrologueOneArg:
    def __call__(self, executor): ...

class NotCallable:
    pass

class Inherited(Prologue):
    pass

class EventClass:
    def __init__(self, executor): ...

class EventCallable:
    def __call__(self, executor): ...

@functools.lru_cache
def decorated(): ...

def rebound(executor): ...
rebound = functools.partial(rebound, 1)
"""


@pytest.fixture
def module(tmp_path, monkeypatch):
    (tmp_path / "callhooks.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "callhooks", raising=False)
    return "callhooks"


@pytest.mark.parametrize(
    ("attr", "call", "words"),
    [
        ("no_args", hook_calls.EVENT, "takes 0 positional arguments, but is called with 1 (executor)"),
        ("prologue_fn", hook_calls.EVENT, "takes 2 positional arguments, but is called with 1 (executor)"),
        ("event", hook_calls.PROLOGUE, "takes 1 positional argument, but is called with 2 (executor, inputs)"),
        ("needs_keyword", hook_calls.EVENT, "needs keyword-only level"),
        ("PrologueNeedsConfig", hook_calls.PROLOGUE, "makes with no arguments, but its __init__ needs some"),
        ("PrologueOneArg", hook_calls.PROLOGUE, "takes 1 positional argument, but is called with 2"),
        ("NotCallable", hook_calls.PROLOGUE, "is a class without __call__"),
        ("Prologue", hook_calls.EVENT, "takes 2 positional arguments, but is called with 1 (executor)"),
        ("EventClass", hook_calls.PROLOGUE, "makes with no arguments, but its __init__ needs some"),
        # the runtime instantiates an event's class with no arguments too, then calls the instance
        ("EventClass", hook_calls.EVENT, "makes with no arguments, but its __init__ needs some"),
        ("NotCallable", hook_calls.EVENT, "is a class without __call__, and its instance is called (executor)"),
    ],
)  # fmt: skip
def test_a_definition_that_cannot_take_the_call_says_why(module, attr, call, words):
    got = hook_calls.problem(module, attr, call)
    assert got is not None and words in got, got


@pytest.mark.parametrize(
    ("attr", "call"),
    [
        ("event", hook_calls.EVENT),
        ("event_with_options", hook_calls.EVENT),
        ("event_with_options", hook_calls.PROLOGUE),
        ("prologue_fn", hook_calls.PROLOGUE),
        ("Prologue", hook_calls.PROLOGUE),
        ("Inherited", hook_calls.PROLOGUE),
        ("EventCallable", hook_calls.EVENT),
        ("Inherited", hook_calls.EVENT),  # its base's __init__ is not read: taken on trust
        ("decorated", hook_calls.EVENT),
        ("rebound", hook_calls.EVENT),
    ],
)
def test_what_takes_the_call_or_cannot_be_read_passes(module, attr, call):
    assert hook_calls.problem(module, attr, call) is None


def test_a_function_given_as_the_decode_prologue_is_an_error_at_its_line():
    """The review's case: an at_shutdown function named as the decode prologue failed only at start-up."""
    with pytest.raises(ManifestError) as e:
        resolve(parse_manifest(HEAD + "  decode_prologue: fastpath.runtime.events:health_check\n", "m.yaml"))
    assert str(e.value) == (
        "m.yaml:6:20: error: hook 'fastpath.runtime.events:health_check': fastpath.runtime.events:health_check "
        "takes 1 positional argument, but is called with 2 (executor, inputs)"
    )


def test_fastpaths_own_hooks_take_their_calls():
    plan = resolve(
        parse_manifest(
            HEAD + "  decode_prologue: fastpath.runtime.prologues:FusedDecodePrologue\n"
            "  executor_events: {after_warmup: [fastpath.runtime.events:retain_host_pages],"
            " at_shutdown: [fastpath.runtime.events:health_check]}\n",
            "m.yaml",
        )
    )
    assert plan.hooks.decode_prologue.attr == "FusedDecodePrologue"
