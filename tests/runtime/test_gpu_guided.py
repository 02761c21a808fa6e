"""Guided decoding on a CUDA device: the bitmask callback captured in the decode graphs, per dispatch mode."""

import json

import jsonschema
import pytest
from guided_cases import PROMPTS, SCHEMAS

from fastpath.runtime import LLM, SamplingParams

pytestmark = pytest.mark.gpu
pytest.importorskip("xgrammar")

EXACT = list(range(1, 9))


def _llm(mode):
    return LLM("random:tiny-llama", device="cuda", dtype="bfloat16", max_seq_len=320, max_batch_size=8,
               graph_batch_sizes=EXACT, guided_backend="xgrammar", dispatch_mode=mode)  # fmt: skip


@pytest.fixture(scope="module")
def by_mode():
    outs = {}
    for mode in ("blocking", "spin"):
        with _llm(mode) as llm:
            kinds = {k for _, k in llm.executor.graphs.graphs}
            assert {"guided_greedy", "guided_general"} <= kinds, (
                f"guided decode graphs were captured: {kinds}"
            )
            backend = llm.executor.dispatcher.backend
            results = {}
            for name, schema in SCHEMAS.items():
                params = [
                    SamplingParams(max_tokens=200, temperature=1.0, seed=s, guided={"json_schema": schema})
                    for s in range(4)
                ]
                results[name] = [
                    (o.outputs[0].text, o.outputs[0].finish_reason) for o in llm.generate(PROMPTS, params)
                ]
            outs[mode] = (backend, results)
    return outs


def test_every_finished_output_validates_under_graphs(by_mode):
    for mode, (_, results) in by_mode.items():
        for name, outs in results.items():
            finished = [t for t, r in outs if r == "stop"]
            assert len(finished) >= 3, f"{mode}/{name}: {outs}"
            for text in finished:
                jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_greedy_guided_requests_replay_the_greedy_guided_graphs():
    with _llm("spin") as llm:
        assert llm.executor.guided.fill == "native"
        graphs, replayed = llm.executor.graphs, []
        replay = graphs.replay
        graphs.replay = lambda rows, kind: (replayed.append(kind), replay(rows, kind))[1]
        finished = 0
        for schema in SCHEMAS.values():
            # Greedy on random weights may repeat a digit for ever: only finished outputs can be checked.
            for o in llm.generate(
                PROMPTS, SamplingParams(temperature=0.0, max_tokens=200, guided={"json_schema": schema})
            ):
                assert o.outputs[0].finish_reason in ("stop", "length"), o.outputs[0].finish_reason
                if o.outputs[0].finish_reason == "stop":
                    jsonschema.validate(json.loads(o.outputs[0].text), schema)
                    finished += 1
        assert finished >= len(SCHEMAS), f"only {finished} greedy guided outputs finished"
        assert set(replayed) == {"guided_greedy"}, set(replayed)


def test_outputs_are_identical_across_dispatch_modes(by_mode):
    (b1, r1), (b2, r2) = by_mode["blocking"], by_mode["spin"]
    assert b1 == "blocking" and b2 in ("doorbell", "hostfunc_v2")
    assert r1 == r2


def test_free_requests_are_undisturbed_under_graphs():
    with _llm("spin") as llm:
        free = [
            SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
            SamplingParams(max_tokens=25, temperature=0.9, seed=5),
        ]
        alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], free)]
        guided = SamplingParams(
            max_tokens=60, temperature=1.0, seed=1, guided={"json_schema": SCHEMAS["enum"]}
        )
        mixed = llm.generate(
            [PROMPTS[2], PROMPTS[0], PROMPTS[3], PROMPTS[1]], [guided, free[0], guided, free[1]]
        )
        assert [mixed[1].outputs[0].token_ids, mixed[3].outputs[0].token_ids] == alone
