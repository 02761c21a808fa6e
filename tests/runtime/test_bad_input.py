"""A bad request fails alone: a ValueError names it, and the others produce their normal tokens."""

import pytest

from fastpath.runtime import LLM, RequestError, SamplingParams

GOOD = [[5, 6, 7], [8, 9, 10, 11]]


@pytest.fixture(scope="module")
def llm():
    return LLM("random:tiny-mistral", device="cpu", max_seq_len=64, max_batch_size=4)


@pytest.mark.parametrize(
    ("bad_prompt", "bad_params", "message"),
    [
        ([], SamplingParams(temperature=0.0), "empty prompt"),
        (
            list(range(3, 70)),
            SamplingParams(temperature=0.0),
            "leaves no room to generate: max_seq_len (max_model_len) is 64",
        ),
        ([5, 512], SamplingParams(temperature=0.0), "token id 512 is out of range [0, 512)"),
        ([5, -1], SamplingParams(temperature=0.0), "token id -1 is out of range"),
    ],
)
def test_bad_request_is_named_and_others_run(llm, bad_prompt, bad_params, message):
    p = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(GOOD, p)]
    with pytest.raises(ValueError, match="request 1: ") as info:
        llm.generate([GOOD[0], bad_prompt, GOOD[1]], [p, bad_params, p])
    assert message in str(info.value)
    assert isinstance(info.value, RequestError)
    outs = info.value.outputs
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == expected
    assert outs[1].outputs[0].finish_reason == "error" and message in outs[1].error
    # errors="return" hands back the same outputs instead of raising.
    returned = llm.generate([GOOD[0], bad_prompt, GOOD[1]], [p, bad_params, p], errors="return")
    assert [returned[0].outputs[0].token_ids, returned[2].outputs[0].token_ids] == expected and returned[
        1
    ].error


def test_a_text_prompt_without_a_tokenizer_fails_alone():
    from fastpath.runtime.model.presets import resolve_random

    # Past the synthetic tokenizer's size, a random model has no tokenizer at all.
    cfg = resolve_random("random:tiny-mistral").replace(vocab_size=5000)
    llm = LLM(cfg, device="cpu", max_seq_len=64)
    assert llm.tokenizer is None
    with pytest.raises(RequestError, match="request 0: a text prompt needs a tokenizer") as info:
        llm.generate(["text", GOOD[0]], SamplingParams(temperature=0.0, max_tokens=3))
    assert len(info.value.outputs[1].outputs[0].token_ids) == 3


def test_engine_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown random preset"):
        LLM("random:nope")
    with pytest.raises(ValueError, match="not a directory"):
        LLM("/nonexistent/checkpoint")
    with pytest.raises(ValueError, match="dtype"):
        LLM("random:tiny-llama", dtype="int8")
    with pytest.raises(ValueError, match="CUDA graphs were requested on a CPU device"):
        LLM("random:tiny-llama", device="cpu", cuda_graphs=True)
