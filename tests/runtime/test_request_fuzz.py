"""Hostile requests mixed with good ones in one batch: every bad one gets its own error naming it, every
good one equals its solo run, and the engine serves normally afterwards."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastpath.runtime import LLM, RequestError, SamplingParams

VOCAB = 512
GOOD_PROMPTS = [[5, 6, 7], [9, 10], [30, 31, 32, 33]]


@pytest.fixture(scope="module")
def llm(tiny_text_checkpoint):
    engine = LLM(str(tiny_text_checkpoint), device="cpu", max_seq_len=48, max_batch_size=8)
    yield engine
    engine.close()


def _deep(n: int) -> dict:
    value: dict = {"type": "string"}
    for _ in range(n):
        value = {"type": "object", "properties": {"x": value}}
    return value


# Prompts and constraints no engine can run; each must fail alone, with a message.
BAD_PROMPTS = st.sampled_from(
    [
        [],
        [1.5, 2.0],
        [True, 3],
        [VOCAB],
        [-1],
        [1 << 70],
        list(range(1, 60)),  # past max_seq_len
        {"prompt_token_ids": "abc"},
        {"bogus": [1]},
        None,
        object(),
    ]
)
BAD_GUIDED = st.sampled_from(
    [
        {"json_schema": {1: "a", "b": 2}},
        {"json_schema": {"enum": {1, 2}}},
        {"json_schema": _deep(3000)},
        {"regex": "([a-z"},
        {"grammar": "root ::= ("},
        {"nope": 1},
        {"json_object": "yes"},
    ]
)
# Valid but extreme: they must run, and must not disturb the batch.
EXTREME = st.sampled_from(
    [
        SamplingParams(max_tokens=4, ignore_eos=True, seed=(1 << 63) - 1, temperature=1.0, n=2),
        SamplingParams(max_tokens=4, ignore_eos=True, top_k=(1 << 31) - 1, temperature=0.7, seed=1),
        SamplingParams(max_tokens=4, ignore_eos=True, top_p=1e-50, temperature=1.0, seed=2),
        SamplingParams(
            temperature=0.0, max_tokens=4, ignore_eos=True, stop_token_ids=[VOCAB - 1], logprobs=20
        ),
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, stop=["\x00", "ü" * 50], min_tokens=2),
    ]
)
GOOD = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def solo(llm):
    return [llm.generate([p], GOOD)[0].outputs[0].token_ids for p in GOOD_PROMPTS]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(st.sampled_from(["good", "bad_prompt", "bad_guided", "extreme"]), min_size=2, max_size=7),
    bad_prompt=BAD_PROMPTS,
    bad_guided=BAD_GUIDED,
    extreme=EXTREME,
)
def test_hostile_requests_fail_alone(llm, solo, kinds, bad_prompt, bad_guided, extreme):
    prompts, params, sent = [], [], []
    for k, kind in enumerate(kinds):
        good = GOOD_PROMPTS[k % len(GOOD_PROMPTS)]
        if kind == "bad_prompt":
            prompts.append(bad_prompt)
            params.append(GOOD)
        elif kind == "bad_guided":
            try:
                bad = SamplingParams(temperature=0.0, max_tokens=3, guided=bad_guided)
            except ValueError as exc:  # refused where it enters: not JSON data, or no such constraint
                assert str(exc).startswith("guided"), exc
                continue
            prompts.append(good)
            params.append(bad)  # it parses, and fails to compile in the engine
        else:
            prompts.append(good)
            params.append(extreme if kind == "extreme" else GOOD)
        sent.append((k, kind))
    outs = llm.generate(prompts, params, errors="return")
    for (k, kind), out in zip(sent, outs, strict=True):
        if kind.startswith("bad"):
            assert out.error and out.outputs[0].finish_reason == "error", (kind, out)
        else:
            assert out.error is None, (kind, out.error)
            assert all(c.finish_reason in ("length", "stop") for c in out.outputs)
        if kind == "good":
            assert out.outputs[0].token_ids == solo[k % len(GOOD_PROMPTS)]
    if any(kind.startswith("bad") for _, kind in sent):
        with pytest.raises(RequestError, match=r"request \d+: "):
            llm.generate(prompts, params)
    # The engine serves normally afterwards.
    assert llm.generate([GOOD_PROMPTS[0]], GOOD)[0].outputs[0].token_ids == solo[0]
