"""Guided constraints below the engine: specs checked where they enter, grammars compiled once, and
the two backends' matchers and masks interchangeable."""

import re

import numpy as np
import pytest
from guided_cases import BACKENDS, MALFORMED, SCHEMAS, UNCOMPILABLE, VOCAB

from fastpath.runtime.guided.backends import make_backend
from fastpath.runtime.guided.grammar_cache import GrammarCache
from fastpath.runtime.guided.spec import GrammarError, parse_spec


@pytest.mark.parametrize(("spec", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_specs_raise_value_errors_that_say_why(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_spec(spec)


def test_equal_constraints_share_one_key_and_keep_the_order_of_their_properties():
    a = parse_spec({"json_schema": {"b": [1, 2.5, None], "a": {"y": True, "x": "é"}}})
    b = parse_spec({"json_schema": '{"b": [1, 2.5, null], "a": {"y": true, "x": "é"}}'})
    assert a.key == b.key and a.source == '{"b":[1,2.5,null],"a":{"y":true,"x":"é"}}'
    assert parse_spec({"choice": ("x", "y")}).key == parse_spec({"choice": ["x", "y"]}).key


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_for_refuses_every_hostile_constraint_with_a_value_error(decoders, backend):
    g = decoders(backend)
    for spec, message in MALFORMED:
        with pytest.raises(ValueError, match=re.escape(message)):
            g.state_for(spec)
    for spec in UNCOMPILABLE:
        kind = next(iter(spec))
        with pytest.raises(GrammarError, match=rf"^guided {kind} does not compile: \S"):
            g.state_for(spec)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grammars_compile_once_per_constraint_within_a_bound(tokenizer, backend):
    cache = GrammarCache(make_backend(backend, tokenizer, VOCAB), capacity=2)
    a, b, c = (parse_spec({"regex": r}) for r in ("[a-z]+", "[0-9]+", "x|y"))
    assert cache.get(a) is cache.get(parse_spec({"regex": "[a-z]+"}))
    assert cache.compilations == 1
    cache.get(b)
    cache.get(c)
    assert len(cache) == 2 and cache.compilations == 3
    cache.get(a)  # evicted as least recently used: compiled again
    assert cache.compilations == 4
    with pytest.raises(GrammarError):
        cache.get(parse_spec({"regex": "([a-z"}))
    assert len(cache) == 2 and cache.compilations == 4  # a failure is not cached


def _masks(g, spec, text):
    """The bitmask rows of `spec` before and after each token of `text`, filled as the engine fills them."""
    state = g.state_for(spec)
    rows = []
    for token in [None, *text]:
        if token is not None:
            state.row.accept(token)
        g.filler.fill([None, state.row])
        rows.append(g.host_mask[1].numpy().copy())
    return rows, state


def _allowed(words, vocab=VOCAB):
    return set(np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]).tolist())


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        ({"regex": "[a-z]{2,6}!"}, "abc!"),
        ({"choice": ["red", "green light"]}, "green light"),
        ({"json_schema": SCHEMAS["number"]}, '{"x": 1.5, "n": 12}'),
    ],
    ids=["regex", "choice", "json_schema"],
)
def test_both_backends_fill_one_bitmask_layout(decoders, tokenizer, spec, text):
    """Along the tokenizer's own path both masks allow each next token, at the same word and bit;
    llguidance allows a subset of xgrammar (it also refuses non-canonical tokenizations)."""
    pytest.importorskip("xgrammar")
    pytest.importorskip("llguidance")
    ids = tokenizer.encode(text, add_special_tokens=False)
    xg, _ = _masks(decoders("xgrammar"), spec, ids)
    ll, _ = _masks(decoders("llguidance"), spec, ids)
    for step, (x, g) in enumerate(zip(xg, ll, strict=True)):
        x, g = _allowed(x), _allowed(g)
        expected = ids[step] if step < len(ids) else tokenizer.eos_token_id
        assert expected in x and expected in g, f"after {step} tokens of {text!r}"
        assert g <= x and len(g) < VOCAB // 2, f"after {step} tokens of {text!r}: {sorted(g - x)}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_ends_with_the_end_token_and_not_before(decoders, tokenizer, backend):
    g = decoders(backend)
    state = g.state_for({"regex": "ab|c"})
    row = state.row
    for token in tokenizer.encode("ab", add_special_tokens=False):
        row.accept(token)
    assert row.live and not row.terminated, "complete, but still constrained until it ends"
    row.accept(tokenizer.eos_token_id)
    assert row.terminated and not row.live and row.error is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refused_token_is_the_rows_error(decoders, tokenizer, backend):
    row = decoders(backend).state_for({"regex": "[a-z]+"}).row
    bad = tokenizer.encode("9", add_special_tokens=False)[0]
    row.accept(bad)
    assert not row.live and row.error == f"token {bad} was sampled outside the grammar"


def test_llguidance_fills_many_rows_in_one_call_as_one_row_at_a_time(decoders, tokenizer):
    """Its parallel fill writes each planned row where the plan puts it, and leaves free rows alone."""
    llg_numpy = pytest.importorskip("llguidance.numpy")
    g = decoders("llguidance")
    assert g.fill == "python"
    specs = [{"regex": "[a-z]{2,6}!"}, None, {"choice": ["red", "green light"]}]
    states = [None if s is None else g.state_for(s) for s in specs]
    g.host_mask.fill_(7)
    g.filler.fill([None if s is None else s.row for s in states])
    assert g.host_rows[:3].tolist() == [1, 0, 1]
    assert (g.host_mask[1] == 7).all(), "a free row's words are not written"
    for r in (0, 2):
        alone = np.zeros((1, g.words), dtype=np.int32)
        llg_numpy.fill_next_token_bitmask(g.cache.matcher(states[r].spec), alone, 0)
        np.testing.assert_array_equal(g.host_mask[r].numpy(), alone[0])
