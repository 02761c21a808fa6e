"""Guided decoding with xgrammar: every finished output is valid, free requests are undisturbed."""

import json
import re
import warnings

import jsonschema
import pytest
from guided_cases import PROMPTS, SCHEMAS

from fastpath.runtime import LLM, RequestError, SamplingParams
from fastpath.runtime.guided.spec import parse_spec

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def llm(tiny_text_checkpoint):
    return LLM(
        str(tiny_text_checkpoint), device="cpu", max_seq_len=320, max_batch_size=8, guided_backend="xgrammar"
    )


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
            _guided({"json_object": True}, 1, max_tokens=120),
            _guided({"regex": r"[a-z]{3,6}@[a-z]{2,5}\.(com|org)"}, 2),
            _guided({"grammar": 'root ::= "yes" | "no" | "maybe " [0-9]'}, 3),
        ],
    )
    assert all(o.outputs[0].finish_reason == "stop" for o in outs[1:])
    if outs[0].outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(outs[0].outputs[0].text), dict)
    assert re.fullmatch(r"[a-z]{3,6}@[a-z]{2,5}\.(com|org)", outs[1].outputs[0].text)
    assert re.fullmatch(r"yes|no|maybe [0-9]", outs[2].outputs[0].text)


def test_free_requests_are_undisturbed_by_guided_ones(llm):
    free = [
        SamplingParams(max_tokens=30, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=0.9, seed=5),
    ]
    alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], free)]
    mixed = llm.generate(
        [PROMPTS[2], PROMPTS[0], PROMPTS[3], PROMPTS[1]],
        [_guided({"json_schema": SCHEMAS["enum"]}, 1), free[0], _guided({"regex": "[0-9]+"}, 2), free[1]],
    )
    assert [mixed[1].outputs[0].token_ids, mixed[3].outputs[0].token_ids] == alone


def test_a_bad_grammar_fails_its_request_alone(llm):
    p = SamplingParams(max_tokens=10, ignore_eos=True)
    expected = llm.generate([PROMPTS[0]], p)[0].outputs[0].token_ids
    with pytest.raises(RequestError, match=r"request 1: guided regex does not compile: .*Unclosed") as info:
        llm.generate([PROMPTS[0], PROMPTS[1]], [p, _guided({"regex": "([a-z"}, 1)])
    assert info.value.outputs[0].outputs[0].token_ids == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"regex": "a", "grammar": "b"}, "exactly one of"),
        ({"json": {}}, "unknown constraint 'json'"),
        ({"json_object": "yes"}, "json_object must be True"),
        ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
        ({"json_schema": [1]}, "json_schema must be an object"),
        ({"regex": ""}, "regex must be a non-empty string"),
        ("[a-z]", "must be a dict"),
    ],
)
def test_malformed_specs_raise_value_errors(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_spec(spec)


def test_grammars_compile_once_per_constraint_within_a_bound(tiny_text_checkpoint):
    from fastpath.runtime.guided.grammar_cache import GrammarCache
    from fastpath.runtime.model.tokenizer import load_tokenizer

    cache = GrammarCache(load_tokenizer(tiny_text_checkpoint), 512, capacity=2)
    a, b, c = (parse_spec({"regex": r}) for r in ("[a-z]+", "[0-9]+", "x|y"))
    assert cache.get(a) is cache.get(parse_spec({"regex": "[a-z]+"}))
    assert cache.compilations == 1
    cache.get(b)
    cache.get(c)
    assert len(cache) == 2 and cache.compilations == 3
    cache.get(a)  # evicted as least recently used: compiled again
    assert cache.compilations == 4


def test_guided_decoding_is_on_by_default_and_off_when_asked(tiny_text_checkpoint):
    plain = LLM(str(tiny_text_checkpoint), device="cpu", max_seq_len=64)
    out = plain.generate(["x"], _guided({"regex": "[0-9]{3}"}, 1))[0].outputs[0]
    assert out.finish_reason == "stop" and re.fullmatch("[0-9]{3}", out.text)
    off = LLM(str(tiny_text_checkpoint), device="cpu", max_seq_len=64, guided_backend="none")
    with pytest.raises(RequestError, match=r"guided decoding is off in this engine: .*pip install"):
        off.generate(["x"], _guided({"json_object": True}, 1))


def test_matcher_calls_hold_the_gil_without_touching_xgrammars_own_wrappers(llm):
    from xgrammar.tvm_ffi_binding import BatchGrammarMatcher

    calls = llm.executor.guided.calls
    assert calls.holds_gil, "the installed xgrammar exposes its tvm-ffi methods; the fill must hold the GIL"
    assert calls._fill.release_gil is False
    shared = {m.name: m.func for m in BatchGrammarMatcher.__tvm_ffi_type_info__.methods}
    assert (
        shared["batch_fill_next_token_bitmask"].release_gil is True
    )  # other users in the process keep theirs


def test_the_native_binding_runs_the_fill_in_cpp(llm):
    assert llm.executor.guided.fill == "native"


def test_the_python_fill_gives_the_same_tokens_as_the_native_fill(tiny_text_checkpoint, llm, monkeypatch):
    from fastpath.runtime.guided import decoder

    monkeypatch.setattr(decoder, "matcher_api", lambda extension: None)
    python = LLM(
        str(tiny_text_checkpoint), device="cpu", max_seq_len=320, max_batch_size=8, guided_backend="xgrammar"
    )
    assert python.executor.guided.fill == "python"
    params = [_guided({"json_schema": schema}, seed) for seed, schema in enumerate(SCHEMAS.values())]
    prompts = (PROMPTS * 2)[: len(params)]
    native_outs, python_outs = llm.generate(prompts, params), python.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in native_outs] == [o.outputs[0].token_ids for o in python_outs]
    python.close()


def test_a_native_fill_on_a_worker_thread_matches_xgrammar_and_reports_refused_tokens(llm):
    """The doorbell's worker (a simulated device) runs the fill: no GIL, not the launching thread."""
    import numpy as np
    import xgrammar as xgr
    from hostdispatch_exts import sim_extension

    from fastpath.runtime import _hostdispatch as ext
    from fastpath.runtime.dispatch.dispatcher import HostDispatcher, HostDispatchFallbackWarning

    g = llm.executor.guided
    sim = sim_extension()
    stream = sim.SimStream()
    with warnings.catch_warnings():  # the fall back to the doorbell warns once per process
        warnings.simplefilter("ignore", HostDispatchFallbackWarning)
        d = HostDispatcher("spin", extension=ext, device=sim.SimDevice(hostfunc_v2=False), stream=stream)
    assert d.backend == "doorbell"
    spec = parse_spec({"regex": "[a-z]{2,6}!"})
    state, reference = g.state_for(spec), xgr.GrammarMatcher(g.cache.get(spec))
    good = llm.tokenizer.encode("ab", add_special_tokens=False)[0]
    bad = llm.tokenizer.encode("9", add_special_tokens=False)[0]
    assert reference.accept_token(good)
    expected = np.full((1, g.words), -1, dtype=np.int32)
    reference.fill_next_token_bitmask(expected, 0)
    seqs = [None, type("Seq", (), {"guided": state})()]
    for token, live in ((good, True), (bad, False)):
        g.host_tokens[1] = token
        g.enqueue(seqs, 3)
        d.launch_guided_fill(g.filler)
        stream.synchronize()
        assert state.row.live is live and g.host_rows[:3].tolist() == [0, int(live), 0]
        if live:
            assert (g.host_mask[1].numpy() == expected[0]).all()
    assert state.row.accepted == 2 and state.error == f"token {bad} was sampled outside the grammar"
    d.shutdown(5.0)
    stream.close()


def test_a_native_fill_reports_a_step_without_a_plan_and_refuses_bad_buffers_and_long_plans(llm):
    import torch

    from fastpath.runtime import _hostdispatch as ext
    from fastpath.runtime.dispatch.dispatcher import HostDispatcher

    tokens, flags = torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int32)
    fill = ext.GuidedFill(tokens, torch.zeros(4, 3, dtype=torch.int32), flags, 4, 3)
    d = HostDispatcher("inline", device="cpu")
    d.launch_guided_fill(fill)  # nothing enqueued
    assert fill.take_errors() == [
        "a guided fill ran with no row plan queued: this step's rows run unconstrained"
    ]
    assert flags.tolist() == [0, 0, 0, 0] and fill.take_errors() == []
    with pytest.raises(ValueError, match="a row plan of 5 rows; this fill holds 4"):
        fill.enqueue([None] * 5)
    with pytest.raises(
        ValueError, match="GuidedFill: mask is not a contiguous CPU tensor of the expected size"
    ):
        ext.GuidedFill(tokens, torch.zeros(3, 4, dtype=torch.int32).t(), flags, 4, 3)
    with pytest.raises(ValueError, match="GuidedFill: tokens is not a contiguous CPU tensor"):
        ext.GuidedFill(tokens.int(), torch.zeros(4, 3, dtype=torch.int32), flags, 4, 3)
