"""The offline API people already know: vLLM's LLM, SamplingParams and outputs, chat, stop strings, n."""

import functools

import pytest

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.outputs import CompletionOutput, RequestOutput
from fastpath.runtime.engine.sampling_params import GuidedDecodingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_text_checkpoint):
    engine = LLM(str(tiny_text_checkpoint), device="cpu", max_model_len=128, max_num_seqs=4)
    yield engine
    engine.close()


def _deep(depth: int) -> dict:
    value: dict = {"type": "object"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"a": value}}
    return value


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1.0}, "SamplingParams.temperature must be a finite number >= 0, got -1.0"),
        ({"temperature": float("nan")}, "SamplingParams.temperature must be"),
        ({"top_p": 0.0}, "SamplingParams.top_p must be a number in (0, 1], got 0.0"),
        ({"top_k": -2}, "SamplingParams.top_k must be an int in [-1, 2147483647]"),
        ({"min_p": 1.5}, "SamplingParams.min_p must be a number in [0, 1]"),
        (
            {"seed": 1 << 63},
            "SamplingParams.seed must be None or an int64, in [-9223372036854775808, 9223372036854775807]",
        ),
        ({"seed": -(1 << 63) - 1}, "SamplingParams.seed must be"),
        ({"max_tokens": 0}, "SamplingParams.max_tokens must be None or an int in [1, 2147483647]"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens (5) must not exceed max_tokens (2)"),
        ({"n": 0}, "SamplingParams.n must be an int in [1, 256]"),
        ({"stop": ""}, "SamplingParams.stop must be a non-empty string or a list of them"),
        ({"stop_token_ids": [1.5]}, "SamplingParams.stop_token_ids must be token ids"),
        ({"stop_token_ids": [True]}, "SamplingParams.stop_token_ids must be token ids"),
        ({"presence_penalty": 3}, "SamplingParams.presence_penalty must be a number in [-2, 2]"),
        ({"repetition_penalty": 0}, "SamplingParams.repetition_penalty must be a number in (0, 100]"),
        ({"logprobs": 21}, "SamplingParams.logprobs must be None or an int in [0, 20]"),
        ({"ignore_eos": 1}, "SamplingParams.ignore_eos must be a bool"),
        ({"guided_decoding": {"regex": "a", "json": {}}}, "set exactly one of"),
        ({"guided_decoding": {"json": _deep(500)}}, "guided: json_schema nests deeper than 64 levels"),
        ({"min_tokens": 1 << 63}, "SamplingParams.min_tokens must be an int in [0, 2147483647]"),
        ({"stop": [f"s{i}" for i in range(129)]}, "SamplingParams.stop must hold at most 128 strings"),
        ({"stop": ["x" * 16385]}, "of at most 16384 characters in all, got 1 of 16385"),
        ({"guided": {"regex": "a"}, "structured_outputs": {"regex": "b"}}, "both set a constraint"),
    ],
)
def test_sampling_params_are_checked_at_construction(kwargs, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value)


def test_sampling_params_are_keyword_only_and_accept_vllm_spellings():
    with pytest.raises(TypeError):
        SamplingParams(0.5)  # type: ignore[misc]
    p = SamplingParams(
        top_k=-1, logprobs=True, stop="###", structured_outputs=GuidedDecodingParams(regex="[0-9]")
    )
    assert p.top_k == 0 and p.logprobs == 0 and p.stop == ["###"] and p.guided == {"regex": "[0-9]"}


def test_stop_fields_accept_none_and_are_lists_as_in_vllm():
    assert SamplingParams(stop=None, stop_token_ids=None) == SamplingParams()
    assert SamplingParams().stop == [] and SamplingParams().stop_token_ids == []
    given = [1, 2]
    p = SamplingParams(stop="###", stop_token_ids=given)
    assert p.stop == ["###"] and p.stop_token_ids == [1, 2]
    given.append(3)  # a copy is kept
    assert p.stop_token_ids == [1, 2] and SamplingParams(stop_token_ids=(1, 2)) == p.clone(stop=None)


def test_sampling_params_hash_copy_and_compare_with_the_constraint():
    import copy
    import pickle

    p = SamplingParams(stop=["x"], stop_token_ids=[4], guided={"regex": "a"})
    assert p != SamplingParams(stop=["x"], stop_token_ids=[4])
    assert p != p.clone(guided={"regex": "b"})
    assert p == SamplingParams(stop="x", stop_token_ids=(4,), guided_decoding={"regex": "a"})
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), p.clone()):
        assert q == p and hash(q) == hash(p)
    assert {p: 1}[p.clone()] == 1


def test_outputs_have_vllms_shape(llm):
    (out,) = llm.generate("The quick brown fox", GREEDY, use_tqdm=False)
    assert isinstance(out, RequestOutput) and out.finished and out.prompt == "The quick brown fox"
    assert out.prompt_token_ids == llm.get_tokenizer()("The quick brown fox")["input_ids"]
    (c,) = out.outputs
    assert isinstance(c, CompletionOutput) and c.index == 0 and len(c.token_ids) == 12
    assert c.finish_reason == "length" and c.stop_reason is None and c.logprobs is None


@pytest.mark.parametrize("prompts", [[[5, 6, 7]], [[5, 6, 7], [8, 9], [10]]])
def test_use_tqdm_shows_vllms_bar_on_stderr_off_a_terminal(llm, prompts, capsys, monkeypatch):
    monkeypatch.delenv("FASTPATH_PROGRESS", raising=False)
    llm.generate(prompts, GREEDY)
    out, err = capsys.readouterr()
    assert "Processed prompts: 100%" in err and f"{len(prompts)}/{len(prompts)}" in err and out == ""
    llm.generate(prompts, GREEDY, use_tqdm=False)
    llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)
    monkeypatch.setenv("FASTPATH_PROGRESS", "0")
    llm.generate(prompts, GREEDY)
    assert capsys.readouterr() == ("", "")


def test_a_use_tqdm_callable_makes_the_bar_and_it_is_closed_on_error(llm, monkeypatch):
    from tqdm import tqdm

    monkeypatch.delenv("FASTPATH_PROGRESS", raising=False)
    made: list = []

    class Recording(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})
            self.kwargs, self.done, self.closed = kwargs, 0, False
            made.append(self)

        def update(self, n=1):
            self.done += n
            if self.kwargs.get("fail"):
                raise RuntimeError("the bar broke")

        def close(self):
            self.closed = True

    llm.chat(
        [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]], GREEDY, use_tqdm=Recording
    )
    (bar,) = made
    assert bar.kwargs["total"] == 2 and bar.kwargs["desc"] == "Processed prompts"
    assert bar.done == 2 and bar.closed
    with pytest.raises(RuntimeError, match="the bar broke"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=functools.partial(Recording, fail=True))
    assert made[1].closed


def test_every_prompt_form_gives_the_same_tokens(llm):
    ids = llm.get_tokenizer()("The quick brown fox")["input_ids"]
    forms = ["The quick brown fox", ids, {"prompt": "The quick brown fox"}, {"prompt_token_ids": ids}]
    outs = llm.generate(forms, sampling_params=GREEDY)
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1


def test_n_completions_equal_single_requests_with_derived_seeds(llm):
    p = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    (out,) = llm.generate([[5, 6, 7]], p)
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    for i, c in enumerate(out.outputs):
        single = SamplingParams(temperature=1.0, seed=7 + i, max_tokens=10, ignore_eos=True)
        assert c.token_ids == llm.generate([[5, 6, 7]], single)[0].outputs[0].token_ids
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "different seeds sample differently"


def test_a_stop_string_spanning_tokens_stops_at_its_first_character(llm):
    free = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[
        0
    ].outputs[0]
    tok = llm.get_tokenizer()
    # A stop string made of the tail of one token and the head of the next.
    pieces = [tok.decode([t]) for t in free.token_ids]
    k = next(i for i in range(3, len(pieces) - 1) if pieces[i] and pieces[i + 1])
    stop = pieces[k][-1] + pieces[k + 1][:1]
    cut = free.text.find(stop)
    for include in (False, True):
        p = SamplingParams(
            temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop], include_stop_str_in_output=include
        )
        c = llm.generate([[5, 6, 7]], p)[0].outputs[0]
        assert c.finish_reason == "stop" and c.stop_reason == stop
        assert c.text == free.text[: cut + (len(stop) if include else 0)]
        assert free.token_ids[: len(c.token_ids)] == c.token_ids, "tokens up to the one completing the stop"
        assert len(tok.decode(c.token_ids)) >= cut


def test_streamed_text_splits_no_character_across_deltas(tiny_text_checkpoint):
    engine = LLM(str(tiny_text_checkpoint), device="cpu", max_model_len=96)
    tok = engine.get_tokenizer()
    # A byte-level tokenizer spells an unseen character as several byte tokens.
    ids = tok("héllo wörld ✓ ünïcode", add_special_tokens=False)["input_ids"]
    forced = SamplingParams(
        temperature=0.0, max_tokens=len(ids) + 16, guided={"regex": "héllo wörld ✓ ünïcode"}
    )
    deltas = [d.outputs[0].text for d in engine.stream([[5, 6]], forced)]
    assert "".join(deltas) == "héllo wörld ✓ ünïcode"
    assert all("\ufffd" not in d for d in deltas), deltas
    engine.close()


def test_a_character_cut_short_by_max_tokens_is_left_out_not_replaced(tiny_text_checkpoint):
    engine = LLM(str(tiny_text_checkpoint), device="cpu", max_model_len=96)
    tok = engine.get_tokenizer()
    whole = len(tok("✓", add_special_tokens=False)["input_ids"])
    assert whole > 1, "the test needs a character spelled by several tokens"
    forced = SamplingParams(temperature=0.0, max_tokens=whole - 1, guided={"regex": "✓✓"})
    (out,) = engine.generate([[5, 6]], forced, use_tqdm=False)
    assert out.outputs[0].text == "" and len(out.outputs[0].token_ids) == whole - 1
    streamed = "".join(d.outputs[0].text for d in engine.stream([[5, 6]], forced))
    assert streamed == ""
    forced = SamplingParams(temperature=0.0, max_tokens=2 * whole - 1, guided={"regex": "✓✓"})
    assert engine.generate([[5, 6]], forced, use_tqdm=False)[0].outputs[0].text == "✓"
    engine.close()


def test_chat_uses_the_template_once_with_no_double_bos(llm):
    tok = llm.get_tokenizer()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, GREEDY)[0]
    expected = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    expected = list(expected["input_ids"]) if hasattr(expected, "keys") else list(expected)
    assert out.prompt_token_ids == expected
    assert out.prompt_token_ids.count(tok.bos_token_id) == 1
    direct = llm.generate({"prompt_token_ids": expected}, GREEDY)[0]
    assert out.outputs[0].token_ids == direct.outputs[0].token_ids
    batch = llm.chat([messages, [{"role": "user", "content": "Hi"}]], GREEDY)
    assert len(batch) == 2 and batch[0].outputs[0].token_ids == out.outputs[0].token_ids


def test_a_misspelt_sampling_keyword_gets_a_suggestion():
    with pytest.raises(TypeError, match=r"argument 'temprature'; did you mean 'temperature'\?$"):
        SamplingParams(temprature=0.5)
    with pytest.raises(TypeError, match=r"argument 'max_new_tokens'; did you mean 'max_tokens'\?$"):
        SamplingParams(max_new_tokens=5)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz'$"):
        SamplingParams(zzz=1)


def test_engine_keywords_follow_vllm_and_unknown_ones_get_a_suggestion(tiny_text_checkpoint):
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'max_model_length'; did you mean 'max_model_len'"
    ):
        LLM(str(tiny_text_checkpoint), max_model_length=64)
    with pytest.raises(ValueError, match="max_model_len=64 and max_seq_len=32 disagree"):
        LLM(str(tiny_text_checkpoint), max_model_len=64, max_seq_len=32)
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        LLM(str(tiny_text_checkpoint), gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        LLM(str(tiny_text_checkpoint), seed=-1)
    with pytest.raises(ValueError, match="enforce_eager must be True or False, got 'no'"):
        LLM(str(tiny_text_checkpoint), enforce_eager="no")
    with pytest.raises(ValueError, match="cuda_graphs must be True, False or None, got 1"):
        LLM(str(tiny_text_checkpoint), cuda_graphs=1)
    with pytest.raises(ValueError, match="engine_process must be True or False, got 'yes'"):
        LLM(str(tiny_text_checkpoint), engine_process="yes")


def test_seed_none_is_the_default_seed_as_vllm_callers_pass_it():
    # Random weights come from the seed: None must give seed 0's model, not an error or another one.
    engines = [LLM("random:tiny-llama", device="cpu", seed=s, max_model_len=32) for s in (None, 0, 1)]
    outs = [e.generate([1, 2, 3], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for e in engines]
    for e in engines:
        e.close()
    assert engines[0].config.seed == 0 and outs[0] == outs[1] != outs[2]


def test_prompt_logprobs_match_the_prompt_logits(llm):
    import torch

    ids = [5, 6, 7, 8]
    (out,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2))
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for j in range(1, len(ids)):
        want = torch.log_softmax(llm.prompt_logits(ids[:j]), -1)
        entry = out.prompt_logprobs[j]
        assert entry[ids[j]].logprob == pytest.approx(float(want[ids[j]]), abs=1e-4)
        ranked = sorted((x for x in entry.values() if x.rank <= 2), key=lambda x: x.rank)
        assert [x.logprob for x in ranked] == pytest.approx(want.topk(2).values.tolist(), abs=1e-4)
        # The prompt's own token carries its rank in the whole vocabulary, top-k or not (as vLLM's).
        assert entry[ids[j]].rank == 1 + int((want > want[ids[j]]).sum())
