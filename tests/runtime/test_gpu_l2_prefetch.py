"""The L2 prefetch hint on CUDA (sm_90): the kernel runs eagerly and on a forked branch of a captured
graph without touching the bytes it asks for, and an engine whose decode graphs ask for each layer's
o_proj and gate_up weights gives the tokens of one that does not."""

import pytest
import torch

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.kernels import l2_prefetch
from fastpath.runtime.kernels.triton_ops import TritonOps

pytestmark = pytest.mark.gpu  # tests/conftest.py skips it where no CUDA device is visible

PROMPTS = [[1, 5, 9, 33, 7], list(range(3, 60)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _needs_bulk_prefetch():
    ok, why = l2_prefetch.available(0)
    if not ok:
        pytest.skip(why)


def test_the_kernel_runs_eagerly_and_in_a_graph_branch_and_changes_nothing(monkeypatch):
    _needs_bulk_prefetch()
    monkeypatch.setattr(l2_prefetch, "BUDGET_BYTES", 24 << 20)
    o = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16)
    before = (o.clone(), gate_up.clone())
    ops = TritonOps()
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)

    def step():
        y = x * 2
        ops.prefetch_l2(1, ((o,), gate_up.chunk(2)))
        y = y @ o.T
        ops.join_prefetches()
        return y

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert torch.equal(o, before[0]) and torch.equal(gate_up, before[1])
    assert not ops._prefetching


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_engine_that_prefetches_gives_the_tokens_of_one_that_does_not(hf_checkpoints, monkeypatch, dtype):
    _needs_bulk_prefetch()
    kw = dict(device="cuda", dtype=dtype, max_seq_len=256, max_batch_size=8)
    base = str(hf_checkpoints["llama"])
    with LLM(base, **kw) as plain:
        want = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, GREEDY)]
    monkeypatch.setattr(l2_prefetch, "BUDGET_BYTES", 16 << 20)
    with LLM(base, **kw) as hinted:
        assert "L2 prefetch of" in hinted.executor.runner.model.ops.describe(torch.device("cuda"))
        assert hinted.executor.runner.graphs is not None
        got = [o.outputs[0].token_ids for o in hinted.generate(PROMPTS, GREEDY)]
    assert got == want
