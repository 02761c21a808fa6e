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


def test_min_tokens_past_a_grammars_end_yields_to_the_grammar_under_graphs():
    """The mask and the min_tokens lift in the guided graphs' kernels (kernels/guided_mask_triton.py):
    a choice ends after a token or two, min_tokens asks for twelve, and the grammar wins, greedy and
    sampled."""
    from guided_cases import CHOICES

    with _llm("spin") as llm:
        for temperature in (0.0, 1.0):
            params = [
                SamplingParams(
                    max_tokens=30, min_tokens=12, temperature=temperature, seed=s, guided={"choice": CHOICES}
                )
                for s in range(4)
            ]
            outs = llm.generate(PROMPTS[:4], params)
            assert [o.outputs[0].finish_reason for o in outs] == ["stop"] * 4, temperature
            assert all(o.outputs[0].text in CHOICES for o in outs), [o.outputs[0].text for o in outs]


def test_the_guided_mask_kernels_equal_their_torch_definition_on_the_gpu():
    """bf16 logits over a Llama-3-sized vocabulary, a row allowed only its stop tokens, padding rows."""
    import torch

    from fastpath.runtime.kernels.guided_mask import guided_mask_reference
    from fastpath.runtime.kernels.guided_mask_triton import guided_mask
    from fastpath.runtime.kernels.sampling import STOP_BIT

    gen = torch.Generator().manual_seed(0)
    n, vocab, slots_col, min_col = 16, 128256, 9, 10
    words = -(-vocab // 32)
    logits = (torch.randn(n, vocab, generator=gen) * 3).to(torch.bfloat16)
    mask = torch.randint(-(2**31), 2**31 - 1, (n + 2, words), generator=gen, dtype=torch.int32)
    flags = (torch.arange(n + 2) % 3 != 1).to(torch.int32)
    stops = torch.tensor([0, 70000, vocab - 1])
    entries = torch.zeros(3, vocab, dtype=torch.int32)
    entries[1, stops] = STOP_BIT
    mask[5] = 0
    mask[5, stops // 32] = (1 << (stops % 32)).to(torch.int32)
    params = torch.randint(0, 50, (n + 2, 12), generator=gen)
    params[:, slots_col], params[:, min_col] = 1, 7
    cuda = [t.cuda() for t in (logits, mask, flags, params, entries)]
    want = guided_mask_reference(*cuda[:3], cuda[3], cuda[4], slots_col, min_col)
    got = guided_mask(cuda[0].clone(), *cuda[1:3], cuda[3], cuda[4], slots_col, min_col)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    assert int(got[1][5, min_col]) == 0 and int(got[1][4, min_col]) == 7
    greedy = guided_mask(cuda[0].clone(), *cuda[1:3])
    assert torch.equal(greedy[0], want[0]) and greedy[1] is None
