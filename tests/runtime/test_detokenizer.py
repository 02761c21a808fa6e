"""Incremental text: the Rust DecodeStream path and the window path give the same text, for any
token sequence fed in any chunks, split characters and invalid bytes included."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from fastpath.runtime.engine.detokenizer import IncrementalText, rust_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_text_checkpoint):
    return AutoTokenizer.from_pretrained(str(tiny_text_checkpoint))


def run(tok, prompt, ids, cuts, stream: bool, skip: bool, stop=()):
    text = IncrementalText(tok, prompt, skip_special_tokens=skip, stop=stop)
    if not stream:
        text._stream = None  # the window path, as for a tokenizer DecodeStream cannot serve
    deltas, start = [], 0
    for cut in [*sorted(cuts), len(ids)]:
        text.add(ids[start:cut])
        start = max(start, cut)
        deltas.append(text.text)
    text.finish()
    return text.text, text.stop_hit, deltas


def test_the_tiny_tokenizer_takes_the_stream_path(tok):
    assert rust_tokenizer(tok) is not None
    assert IncrementalText(tok, [5, 6])._stream is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, 511), max_size=8),
    ids=st.lists(st.integers(0, 511), max_size=24),
    cuts=st.lists(st.integers(0, 24), max_size=6),
    skip=st.booleans(),
)
def test_stream_and_window_paths_agree(tok, prompt, ids, cuts, skip):
    fast = run(tok, prompt, ids, cuts, stream=True, skip=skip)
    slow = run(tok, prompt, ids, cuts, stream=False, skip=skip)
    assert fast[0] == slow[0]
    # Text only grows, and what a stream has released never changes afterwards.
    assert all(b.startswith(a) for a, b in zip(fast[2], fast[2][1:], strict=False))
    assert fast[2][-1] == fast[0] or fast[0].startswith(fast[2][-1])


def test_unicode_split_across_tokens_comes_out_whole(tok):
    ids = tok("héllo ✓ wörld", add_special_tokens=False)["input_ids"]
    one_by_one = [[i] for i in range(len(ids))]
    text, _, deltas = run(tok, [5], ids, [i for (i,) in one_by_one], stream=True, skip=True)
    assert text == "héllo ✓ wörld"
    assert all("\ufffd" not in d for d in deltas)


def test_a_stop_string_is_found_on_the_stream_path(tok):
    ids = tok("one two three four", add_special_tokens=False)["input_ids"]
    text, hit, _ = run(tok, [5], ids, list(range(len(ids))), stream=True, skip=True, stop=("three",))
    assert hit == "three" and text.startswith("one two")
