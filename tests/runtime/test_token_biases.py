"""logit_bias, allowed_token_ids and bad_words, as vLLM means them: biases added before penalties,
bans that hold whatever the batch, and logprobs that stay the model's own."""

import pytest
from test_sampling_controls import token_ids

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.token_biases import bad_word_ids, token_biases

CPU32 = dict(device="cpu", dtype="float32", max_seq_len=64, max_batch_size=3)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9] * 12]
GREEDY = dict(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("random:tiny-llama", **CPU32)


def test_a_large_bias_makes_greedy_pick_the_token_and_logprobs_stay_the_models(llm):
    plain = llm.generate(PROMPTS[:1], SamplingParams(**GREEDY, logprobs=0))[0].outputs[0]
    favourite = next(t for t in range(100, 400) if t not in plain.token_ids)
    out = llm.generate(PROMPTS[:1], SamplingParams(**GREEDY, logprobs=1, logit_bias={favourite: 100}))
    biased = out[0].outputs[0]
    assert biased.token_ids == [favourite] * GREEDY["max_tokens"]
    # The first step's logprobs are the raw logits', as vLLM returns them: the model's own argmax
    # keeps rank 1 and its logprob, and the biased token ranks below it.
    first = biased.logprobs[0]
    model_top = plain.token_ids[0]
    assert first[model_top].rank == 1
    assert first[model_top].logprob == pytest.approx(plain.logprobs[0][model_top].logprob, abs=1e-5)
    assert first[favourite].rank > 1


def test_a_ban_takes_the_next_best_token_and_leaves_other_rows_alone(llm):
    params = SamplingParams(**GREEDY, logprobs=2)
    plain = llm.generate(PROMPTS, params)
    first = plain[0].outputs[0]
    runner_up = next(t for t in first.logprobs[0] if t != first.token_ids[0])
    banned = SamplingParams(**GREEDY, logprobs=2, logit_bias={first.token_ids[0]: -100})
    out = llm.generate(PROMPTS, [banned, params, params])
    assert token_ids(out[0])[0] == runner_up
    assert [token_ids(o) for o in out[1:]] == [token_ids(o) for o in plain[1:]]


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_only_allowed_tokens_are_generated(llm, temperature):
    allowed = [3, 40, 41, 300]
    params = SamplingParams(
        temperature=temperature, seed=7, n=3, max_tokens=16, ignore_eos=True, allowed_token_ids=allowed
    )
    for out in llm.generate(PROMPTS, params):
        for completion in out.outputs:
            assert set(completion.token_ids) <= set(allowed)
    if temperature:  # sampling, not one token for ever: the allow-list still leaves a distribution
        tokens = {t for o in llm.generate(PROMPTS, params) for c in o.outputs for t in c.token_ids}
        assert len(tokens) > 1


def test_bad_words_are_never_generated_with_or_without_a_leading_space(llm):
    tok = llm.tokenizer
    plain = llm.generate(PROMPTS, SamplingParams(**GREEDY))
    seen = {t for o in plain for t in token_ids(o)}
    # A word of one token that greedy decoding produces, banned as a word.
    word = next(w for t in sorted(seen) if len(bad_word_ids(w := tok.decode([t]).strip(), tok)[0]) == 1 and w)
    banned = {ids[0] for ids in bad_word_ids(word, tok)}
    assert banned & seen
    out = llm.generate(PROMPTS, SamplingParams(**GREEDY, bad_words=[word]))
    assert not banned & {t for o in out for t in token_ids(o)}


def test_requests_that_cannot_be_biased_fail_alone_with_their_own_error(llm):
    with pytest.raises(ValueError, match=r"logit_bias: token ids \[4096\] are out of range \[0, 512\)"):
        llm.generate(PROMPTS[:1], SamplingParams(logit_bias={4096: 1.0}))
    with pytest.raises(ValueError, match=r"allowed_token_ids: token ids \[999\]"):
        llm.generate(PROMPTS[:1], SamplingParams(allowed_token_ids=[1, 999]))
    with pytest.raises(
        ValueError, match=r"'hello' is 4 tokens \[74, 71, 274, 81\]; fastpath bans words of one"
    ):
        llm.generate(PROMPTS[:1], SamplingParams(bad_words=["hello"]))
    with pytest.raises(ValueError, match="ban every one of allowed_token_ids"):
        llm.generate(PROMPTS[:1], SamplingParams(allowed_token_ids=[71], bad_words=["e"]))
    assert token_ids(llm.generate(PROMPTS[:1], SamplingParams(**GREEDY))[0])  # the engine runs on


def test_sampling_params_check_and_normalize_biases_as_vllm():
    p = SamplingParams(logit_bias={"5": 250, 7: -0.5}, allowed_token_ids=(1, 2), bad_words=("x",))
    assert p.logit_bias == {5: 100.0, 7: -0.5}  # clamped to OpenAI's range; string ids as ints
    assert p.allowed_token_ids == [1, 2] and p.bad_words == ["x"] and p.biased
    assert hash(p) == hash(
        SamplingParams(logit_bias={5: 100, 7: -0.5}, allowed_token_ids=[1, 2], bad_words=["x"])
    )
    assert not SamplingParams(logit_bias={}).biased
    for bad, words in [
        ({"logit_bias": {"five": 1}}, "logit_bias must be keyed by token ids"),
        ({"logit_bias": {1: float("nan")}}, r"logit_bias\[1\] must be a finite number"),
        ({"logit_bias": dict.fromkeys(range(1025), 1.0)}, "at most 1024 entries"),
        ({"allowed_token_ids": []}, "allowed_token_ids must be None or 1 to 1024"),
        ({"allowed_token_ids": [-1]}, "allowed_token_ids must be token ids"),
        ({"bad_words": "word"}, "bad_words must be a list of non-blank strings"),
    ]:
        with pytest.raises(ValueError, match=words):
            SamplingParams(**bad)


def test_token_biases_merge_allow_lists_bans_and_biases():
    class Tok:  # one token per character; a leading space is a token of its own
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    p = SamplingParams(allowed_token_ids=[5, 6, 98], logit_bias={5: 2.0, 9: 3.0}, bad_words=["b"])
    biases = token_biases(p, Tok(), 128)
    # 9 is not allowed: its bias goes; "b" is banned ("b", and " b" is two tokens: not a variant).
    assert biases.exclusive and biases.ids == (5, 6, 98) and biases.values == (2.0, 0.0, float("-inf"))
    assert token_biases(SamplingParams(), Tok(), 128) is None
    with pytest.raises(ValueError, match="no tokenizer"):
        token_biases(SamplingParams(bad_words=["b"]), None, 128)


def test_biases_survive_chunked_prefill_preemption_and_slot_reuse():
    """Each request's tokens equal its solo run's, though three slots serve five biased requests and a
    small cache preempts and recomputes them (their biases are entered again with their prompt)."""
    cfg = "random:tiny-llama"
    params = [
        SamplingParams(**GREEDY, logit_bias={17: 3.0, 20: -2.0}),
        SamplingParams(
            temperature=0.8, seed=3, max_tokens=10, ignore_eos=True, allowed_token_ids=[1, 17, 90]
        ),
        SamplingParams(**GREEDY, repetition_penalty=1.3, logit_bias={33: 1.5}),
        SamplingParams(**GREEDY),
        SamplingParams(temperature=1.0, seed=5, max_tokens=10, ignore_eos=True, logit_bias={64: -100.0}),
    ]
    prompts = [list(range(3, 30)), [1, 2, 3], [9] * 20, [4, 5], [30, 31] * 6]
    solo = LLM(cfg, **{**CPU32, "max_batch_size": 1})
    want = [token_ids(solo.generate([p], q)[0]) for p, q in zip(prompts, params, strict=True)]
    llm = LLM(cfg, **{**CPU32, "max_num_batched_tokens": 16, "kv_cache_blocks": 5})
    got = [token_ids(o) for o in llm.generate(prompts, params)]
    assert llm.executor.scheduler.num_preemptions > 0, "the cache is small enough to preempt"
    assert got == want


@pytest.mark.slow
def test_tp2_biases_what_one_rank_biases():
    params = [
        SamplingParams(**GREEDY, logit_bias={17: 4.0}),
        SamplingParams(temperature=0.9, seed=2, max_tokens=10, ignore_eos=True, allowed_token_ids=[5, 6, 7]),
        SamplingParams(**GREEDY, bad_words=["e"]),
    ]
    want = [token_ids(o) for o in LLM("random:tiny-llama", **CPU32).generate(PROMPTS, params)]
    with LLM("random:tiny-llama", tp=2, **CPU32) as llm:
        assert [token_ids(o) for o in llm.generate(PROMPTS, params)] == want
