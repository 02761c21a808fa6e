"""Guided decoding end to end, once per backend: every finished output is valid, free requests are
undisturbed, and a bad constraint fails its own request only."""

import json
import re

import jsonschema
import pytest
from guided_cases import BACKENDS, CHOICES, MALFORMED, PROMPTS, SCHEMAS, UNCOMPILABLE

from fastpath.runtime import LLM, RequestError, SamplingParams


@pytest.fixture(scope="module", params=BACKENDS)
def llm(request, tiny_text_checkpoint):
    engine = LLM(
        str(tiny_text_checkpoint),
        device="cpu",
        max_seq_len=320,
        max_batch_size=8,
        guided_backend=request.param,
    )
    assert engine.executor.guided.backend.name == request.param
    yield engine
    engine.close()


def _guided(spec, seed, max_tokens=200):
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, guided=spec)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_finished_output_parses_and_validates(llm, name):
    schema = SCHEMAS[name]
    outs = llm.generate(PROMPTS * 2, [_guided({"json_schema": schema}, seed) for seed in range(8)])
    finished = [o for o in outs if o.outputs[0].finish_reason == "stop"]
    assert len(finished) >= 6, f"only {len(finished)} of 8 finished: {[o.outputs[0].text for o in outs]}"
    for o in finished:
        jsonschema.validate(json.loads(o.outputs[0].text), schema)


def test_json_object_regex_and_grammar(llm):
    outs = llm.generate(
        PROMPTS[:3],
        [
            _guided({"json_object": True}, 1, max_tokens=60),
            _guided({"regex": r"[a-z]{3,6}@[a-z]{2,5}\.(com|org)"}, 2),
            _guided({"grammar": 'root ::= "yes" | "no" | "maybe " [0-9]'}, 3),
        ],
    )
    assert all(o.outputs[0].finish_reason == "stop" for o in outs[1:])
    if outs[0].outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(outs[0].outputs[0].text), dict)
    assert re.fullmatch(r"[a-z]{3,6}@[a-z]{2,5}\.(com|org)", outs[1].outputs[0].text)
    assert re.fullmatch(r"yes|no|maybe [0-9]", outs[2].outputs[0].text)


def test_every_output_of_a_choice_is_one_of_its_strings(llm):
    outs = llm.generate(PROMPTS * 2, [_guided({"choice": CHOICES}, seed, max_tokens=40) for seed in range(8)])
    assert [o.outputs[0].finish_reason for o in outs] == ["stop"] * 8
    assert {o.outputs[0].text for o in outs} <= set(CHOICES)
    assert len({o.outputs[0].text for o in outs}) > 1, (
        "eight seeds chose one string: the choice is not sampled"
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_past_a_grammars_end_yields_to_the_grammar(llm, temperature):
    """A choice ends after a token or two; min_tokens asks for more. The grammar wins: the output is
    one of the choices and ends there (before, the sampler banned the only allowed tokens, drew one
    outside the grammar and ran unconstrained)."""
    params = [
        SamplingParams(
            max_tokens=30, min_tokens=12, temperature=temperature, seed=s, guided={"choice": CHOICES}
        )
        for s in range(4)
    ]
    outs = llm.generate(PROMPTS[:4], params)
    assert [o.outputs[0].finish_reason for o in outs] == ["stop"] * 4
    assert all(o.outputs[0].text in CHOICES for o in outs), [o.outputs[0].text for o in outs]


def test_min_tokens_still_holds_where_the_grammar_can_go_on(llm):
    """[a-z]+ may end after any letter: min_tokens keeps it going, within the grammar."""
    params = [
        SamplingParams(max_tokens=24, min_tokens=10, temperature=1.0, seed=s, guided={"regex": "[a-z]+"})
        for s in range(4)
    ]
    for o in llm.generate(PROMPTS[:4], params):
        out = o.outputs[0]
        assert len(out.token_ids) >= 10 and re.fullmatch("[a-z]+", out.text), (out.text, out.token_ids)


def test_free_requests_are_undisturbed_by_guided_ones(llm):
    free = [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=0.9, seed=5),
    ]
    alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], free)]
    mixed = llm.generate(
        [PROMPTS[2], PROMPTS[0], PROMPTS[3], PROMPTS[1]],
        [_guided({"json_schema": SCHEMAS["enum"]}, 1), free[0], _guided({"regex": "[0-9]+"}, 2), free[1]],
    )
    assert [mixed[1].outputs[0].token_ids, mixed[3].outputs[0].token_ids] == alone


def test_a_bad_grammar_fails_its_request_alone(llm):
    p = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    expected = llm.generate([PROMPTS[0]], p)[0].outputs[0].token_ids
    with pytest.raises(
        RequestError, match=r"(?i)request 1: guided regex does not compile: .*unclosed"
    ) as info:
        llm.generate([PROMPTS[0], PROMPTS[1]], [p, _guided({"regex": "([a-z"}, 1)])
    assert info.value.outputs[0].outputs[0].token_ids == expected


def test_hostile_constraints_are_their_requests_own_errors(llm):
    """Constraints that are not JSON data are refused where they enter, by SamplingParams; ones that
    do not compile fail their request alone; the engine serves on."""
    good = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = llm.generate([PROMPTS[0]], good)[0].outputs[0].token_ids
    for spec, message in MALFORMED:
        if isinstance(spec, dict):
            with pytest.raises(ValueError, match=re.escape(message)):
                SamplingParams(max_tokens=8, guided=spec)
    hostile = UNCOMPILABLE
    params = [good] + [SamplingParams(temperature=0.0, max_tokens=8, guided=spec) for spec in hostile]
    outs = llm.generate([PROMPTS[0]] * len(params), params, errors="return")
    assert outs[0].outputs[0].token_ids == expected
    for spec, out in zip(hostile, outs[1:], strict=True):
        assert out.outputs[0].finish_reason == "error" and out.error.startswith("guided"), (spec, out.error)
    assert llm.generate([PROMPTS[0]], good)[0].outputs[0].token_ids == expected


def test_guided_requests_on_an_engine_built_without_a_backend_say_so(tiny_text_checkpoint):
    plain = LLM(str(tiny_text_checkpoint), device="cpu", max_seq_len=64, guided_backend="none")
    assert plain.executor.guided is None
    with pytest.raises(RequestError, match="guided decoding is off in this engine"):
        plain.generate(["x"], _guided({"json_object": True}, 1))
    plain.close()


def test_a_guided_request_works_on_an_engine_built_with_no_guided_argument(tiny_text_checkpoint):
    pytest.importorskip("xgrammar")
    llm = LLM(str(tiny_text_checkpoint), device="cpu", max_seq_len=320, max_batch_size=2)
    out = llm.generate([PROMPTS[0]], _guided({"json_schema": SCHEMAS["enum"]}, 0))[0]
    assert out.outputs[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.outputs[0].text), SCHEMAS["enum"])
    llm.close()


def test_auto_falls_back_to_llguidance_without_xgrammar(tiny_text_checkpoint, monkeypatch):
    pytest.importorskip("llguidance")
    monkeypatch.setitem(__import__("sys").modules, "xgrammar", None)  # `import xgrammar` now fails
    llm = LLM(
        str(tiny_text_checkpoint), device="cpu", max_seq_len=320, max_batch_size=2, guided_backend="auto"
    )
    assert llm.executor.guided.backend.name == "llguidance" and llm.executor.guided.fill == "python"
    out = llm.generate([PROMPTS[1]], _guided({"choice": CHOICES}, 0, max_tokens=40))[0]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].text in CHOICES
    llm.close()


def test_a_grammar_and_an_allow_list_with_nothing_in_common_fail_that_request_alone(llm):
    """allowed_token_ids that the grammar never allows leave the sampler nothing: the token it draws
    breaks both. That request ends with an error saying so (it ran on unconstrained before), and the
    rest of the batch is untouched."""
    (outside,) = llm.get_tokenizer().encode("Z", add_special_tokens=False)
    spec = {"choice": ["yes", "no"]}
    bad = SamplingParams(max_tokens=12, temperature=0.0, allowed_token_ids=[outside], guided=spec)
    good = SamplingParams(max_tokens=12, temperature=0.0, guided=spec)
    with pytest.raises(
        RequestError, match=r"request 0: guided decoding: token \d+ was sampled outside the grammar"
    ):
        llm.generate(PROMPTS[:2], [bad, good])
    try:
        llm.generate(PROMPTS[:2], [bad, good])
    except RequestError as exc:
        failed, fine = exc.outputs
    assert "allowed_token_ids, bad_words or logit_bias ban every token" in failed.error
    assert fine.error is None and fine.outputs[0].text in ("yes", "no")
    stats = llm.stats()
    assert stats.running == 0 and stats.kv_blocks_free == stats.kv_blocks_total
