"""logit_bias, allowed_token_ids and bad_words, as vLLM means them: biases added before penalties,
bans that hold whatever the batch, and logprobs that stay the model's own."""

import math

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
    word = next(
        w for t in sorted(seen) if (w := tok.decode([t]).strip()) and len(bad_word_ids(w, tok)[0]) == 1
    )
    banned = {ids[0] for ids in bad_word_ids(word, tok)}
    assert banned & seen
    out = llm.generate(PROMPTS, SamplingParams(**GREEDY, bad_words=[word]))
    assert not banned & {t for o in out for t in token_ids(o)}


def test_requests_that_cannot_be_biased_fail_alone_with_their_own_error(llm):
    with pytest.raises(ValueError, match=r"logit_bias: token ids \[4096\] are out of range \[0, 512\)"):
        llm.generate(PROMPTS[:1], SamplingParams(logit_bias={4096: 1.0}))
    with pytest.raises(ValueError, match=r"allowed_token_ids: token ids \[999\]"):
        llm.generate(PROMPTS[:1], SamplingParams(allowed_token_ids=[1, 999]))
    with pytest.raises(ValueError, match=r"bad_words: token ids \[4097\] are out of range \[0, 512\)"):
        biased_vocab = type("Tok", (), {"encode": lambda self, text, add_special_tokens=False: [7, 4097]})()
        token_biases(SamplingParams(bad_words=["hello"]), biased_vocab, 512)
    with pytest.raises(ValueError, match=r"request 0: bad_words ban every one of allowed_token_ids"):
        llm.generate(PROMPTS[:1], SamplingParams(allowed_token_ids=[71], bad_words=["e"]))
    with pytest.raises(
        ValueError, match=r"request 0: logit_bias \(-inf\) ban every one of allowed_token_ids \[33\]"
    ):
        llm.generate(PROMPTS[:1], SamplingParams(allowed_token_ids=[33], logit_bias={33: -math.inf}))
    # a ban on a token the request does not allow anyway is not named
    with pytest.raises(ValueError, match=r"request 0: bad_words ban every one"):
        llm.generate(
            PROMPTS[:1], SamplingParams(allowed_token_ids=[71], bad_words=["e"], logit_bias={33: -math.inf})
        )
    with pytest.raises(ValueError, match=r"request 0: logit_bias \(-inf\) ban every one"):
        llm.generate(
            PROMPTS[:1], SamplingParams(allowed_token_ids=[33], bad_words=["e"], logit_bias={33: -math.inf})
        )
    stops_only = SamplingParams(allowed_token_ids=[40], stop_token_ids=[40], min_tokens=3)
    with pytest.raises(ValueError, match=r"allows \(\[40\]\) is a stop token, which min_tokens=3 bans"):
        llm.generate(PROMPTS[:1], stops_only)
    eos = sorted(llm.eos_ids)
    with pytest.raises(ValueError, match="is a stop token"):
        llm.generate(PROMPTS[:1], SamplingParams(allowed_token_ids=eos, min_tokens=2))
    # Under ignore_eos the model's EOS stops nothing, so it may be all a request allows.
    eos_only = SamplingParams(allowed_token_ids=eos[:1], min_tokens=2, max_tokens=3, ignore_eos=True)
    assert token_ids(llm.generate(PROMPTS[:1], eos_only)[0]) == eos[:1] * 3
    assert token_ids(llm.generate(PROMPTS[:1], SamplingParams(**GREEDY))[0])  # the engine runs on


def test_sampling_params_check_and_normalize_biases_as_vllm():
    inf = float("inf")
    p = SamplingParams(logit_bias={"5": 250, 7: -0.5, 9: -inf}, allowed_token_ids=(1, 2), bad_words=("x",))
    assert p.logit_bias == {5: 250.0, 7: -0.5, 9: -inf}  # string ids as ints; -inf bans
    assert p.allowed_token_ids == [1, 2] and p.bad_words == ["x"] and p.biased
    same = SamplingParams(logit_bias={5: 250, 7: -0.5, 9: -inf}, allowed_token_ids=[1, 2], bad_words=["x"])
    assert hash(p) == hash(same) and p == same
    assert not SamplingParams(logit_bias={}).biased
    for bad, words in [
        ({"logit_bias": {"five": 1}}, "logit_bias must be keyed by token ids"),
        ({"logit_bias": {1: float("nan")}}, r"logit_bias\[1\] must be a finite number, or -inf"),
        ({"logit_bias": {1: inf}}, r"logit_bias\[1\] must be a finite number, or -inf"),
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


def test_a_bad_word_after_a_space_is_banned_too_where_it_is_a_token_of_its_own():
    class Tok:  # " b" is one token, 1000 + "b"; "ab" two ("a", "b"); " ab" two, starting with " a"
        def encode(self, text, add_special_tokens=False):
            head = [1000 + ord(text[1])] if text.startswith(" ") else []
            return head + [ord(c) for c in text[len(head) * 2 :]]

    assert bad_word_ids("b", Tok()) == [[98], [1098]]
    assert bad_word_ids(" b", Tok()) == [[98], [1098]], "a leading space is the word's, not a variant's"
    assert bad_word_ids("ab", Tok()) == [[97, 98], [1097, 98]]
    biases = token_biases(SamplingParams(bad_words=["b"]), Tok(), 2048)
    assert not biases.exclusive and biases.ids == (98, 1098) and biases.values == (float("-inf"),) * 2


def test_a_bias_comes_before_penalties_as_vllm_applies_it():
    """x = 1 with bias -2 and repetition penalty 2 on a seen token: bias first gives (1 - 2) * 2 = -2;
    the other order would give 1 / 2 - 2 = -1.5."""
    import torch

    from fastpath.runtime.kernels.sampling import BIAS_BIT, PROMPT_BIT, penalize
    from fastpath.runtime.runner.sampler import SamplingTensors

    p = SamplingTensors.neutral(1, repetition=[2.0])
    entries = torch.tensor([[BIAS_BIT | PROMPT_BIT, PROMPT_BIT, BIAS_BIT]], dtype=torch.int32)
    bias = torch.tensor([[-2.0, 7.0, float("-inf")]])  # 7: no BIAS_BIT, never added
    x = torch.tensor([[1.0, 1.0, 3.0]])
    assert penalize(x, p, entries, bias).tolist() == [[-2.0, 0.5, float("-inf")]]


def test_a_grammar_whose_other_tokens_are_banned_may_end_under_min_tokens(llm):
    """min_tokens yields where a grammar allows only stop tokens and tokens the biases ban: without
    that, every token would be -inf and the row would leave its grammar."""
    (a,) = llm.tokenizer.encode("a", add_special_tokens=False)
    params = SamplingParams(
        temperature=0.0, max_tokens=8, min_tokens=6, guided={"regex": "a*"}, logit_bias={a: float("-inf")}
    )
    out = llm.generate(PROMPTS[:1], params)[0].outputs[0]
    assert out.text == "" and out.finish_reason == "stop"


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
        # "\x12\x12" is two tokens, 209 209, which greedy decoding of the first prompt repeats.
        SamplingParams(**GREEDY, bad_words=["e", "\x12\x12"]),
        SamplingParams(temperature=0.9, seed=2, max_tokens=10, ignore_eos=True, allowed_token_ids=[5, 6, 7]),
        SamplingParams(**GREEDY, logit_bias={17: 4.0}),
    ]
    want = [token_ids(o) for o in LLM("random:tiny-llama", **CPU32).generate(PROMPTS, params)]
    with LLM("random:tiny-llama", tp=2, **CPU32) as llm:
        assert [token_ids(o) for o in llm.generate(PROMPTS, params)] == want


def test_the_fused_sampler_refuses_entries_copied_out_of_their_table():
    """A biased entry's bias sits half a padded row past it; a copy of the entries view has no second
    half, and the kernel would read past it (bench/sampler.py did, round 25): refused before launch."""
    import torch

    pytest.importorskip("triton")
    from fastpath.runtime.kernels import sampling_triton
    from fastpath.runtime.runner.penalties import PenaltyTable
    from fastpath.runtime.runner.sampler import SamplingTensors

    table = PenaltyTable(3, 100, torch.device("cpu"))
    logits, params = torch.zeros(2, 100), SamplingTensors.neutral(2, slots=[1, 2])
    with pytest.raises(ValueError, match="PenaltyTable's `entries` view"):
        sampling_triton.sample(logits, params, table.entries.clone(), table.bits, 0)
    with pytest.raises(ValueError, match="PenaltyTable's `entries` view"):
        sampling_triton.sample(torch.zeros(2, 200), params, table.entries, table.bits, 0)
