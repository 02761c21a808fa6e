"""Incremental text on its own: text grows whole characters at a time whatever chunks the tokens
arrive in, and equals the one-shot decode; stop strings are found across token boundaries."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from fastpath.runtime.engine.detokenizer import IncrementalText, token_text


@pytest.fixture(scope="module")
def tok(tiny_text_checkpoint):
    return AutoTokenizer.from_pretrained(str(tiny_text_checkpoint))


def run(tok, prompt, ids, cuts, stop=()):
    text = IncrementalText(tok, prompt, stop=stop)
    deltas, start = [], 0
    for cut in [*sorted(cuts), len(ids)]:
        text.add(ids[start:cut])
        start = max(start, cut)
        deltas.append(text.text)
    text.finish()
    return text.text, text.stop_hit, deltas


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet="abcé✓ ü.", max_size=30), cuts=st.lists(st.integers(0, 60), max_size=6))
def test_chunks_do_not_change_the_text_and_it_only_grows(tok, text, cuts):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    whole, _, _ = run(tok, [5], ids, [])
    got, _, deltas = run(tok, [5], ids, cuts)
    assert got == whole == tok.decode([5, *ids])[len(tok.decode([5])) :]
    assert all(b.startswith(a) for a, b in itertools.pairwise(deltas))
    assert all("\ufffd" not in d for d in deltas)


def test_a_stop_string_is_found_across_tokens(tok):
    ids = tok("one two three four", add_special_tokens=False)["input_ids"]
    text, hit, _ = run(tok, [5], ids, list(range(len(ids))), stop=("three",))
    assert hit == "three" and text.startswith("one two")


def test_token_text_is_the_tokens_text_remembered(tok):
    text = token_text(tok)
    assert token_text(tok) is text
    # A byte-level BPE spells a token the same alone as inside a text.
    assert [text(t) for t in range(40)] == [tok.decode([t]) for t in range(40)]


@pytest.fixture(scope="module")
def sentencepiece_tok():
    """A SentencePiece-style tokenizer (Unigram + Metaspace, as Llama 2's): decoding drops the first
    token's leading space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["The", "capital", "of", "France", "is", "Paris", "a", "."]
    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("\u2581", -5.0)]
    pieces += [("\u2581" + w, -1.0) for w in words] + [(c, -8.0) for c in "ThecapitlofFrnsPr."]
    backend = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_a_sentencepiece_token_keeps_its_leading_space(sentencepiece_tok):
    tok = sentencepiece_tok
    ids = tok("The capital of France is Paris.", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids[-2:-1]) == "Paris"  # the decoder's own spelling, alone
    text = token_text(tok)
    assert text(ids[-2]) == " Paris"
    # The tokens spell the completion's text, so completions' text_offset points into it.
    prompt, output = ids[:3], ids[3:]
    completion, _, _ = run(tok, prompt, output, [])
    assert "".join(text(t) for t in output) == completion == " France is Paris."


def _stop_with_min_tokens(tok, ids, stop, min_tokens, chunk=1):
    text = IncrementalText(tok, [5], stop=(stop,), min_tokens=min_tokens)
    for start in range(0, len(ids), chunk):
        if text.add(ids[start : start + chunk]):
            break
    text.finish()
    return text.stop_hit


@pytest.mark.parametrize("chunk", [1, 3])
def test_a_stop_string_written_by_the_first_min_tokens_tokens_does_not_count(tok, chunk):
    ids = tok(" one two three four five", add_special_tokens=False)["input_ids"]
    # k: the tokens it takes to write "two" (as vLLM: stop strings count after min_tokens tokens)
    k = next(n for n in range(1, len(ids) + 1) if "two" in tok.decode([5, *ids[:n]])[len(tok.decode([5])) :])
    assert _stop_with_min_tokens(tok, ids, "two", k - 1, chunk) == "two"
    assert _stop_with_min_tokens(tok, ids, "two", k, chunk) is None
    assert _stop_with_min_tokens(tok, ids, "four", k, chunk) == "four"


def test_token_bytes_rebuild_characters_split_across_tokens(tok, sentencepiece_tok):
    from fastpath.runtime.engine.token_bytes import token_bytes

    raw = token_bytes(tok)
    for text in ["✓ ü日本", " héllo"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert any("\ufffd" in tok.decode([t]) for t in ids), "the case: a character split across tokens"
        assert b"".join(raw(t) for t in ids) == text.encode("utf-8")
    sp_raw = token_bytes(sentencepiece_tok)
    paris = sentencepiece_tok("Paris", add_special_tokens=False)["input_ids"][-1]
    assert sp_raw(paris) == b" Paris"  # whole tokens: the UTF-8 of their text, leading space kept
