"""LoRA adapters on CUDA: graph-replayed decode steps with any mix of adapters give, in float32, the
tokens of HF transformers with each adapter merged into its weights, and a bf16 graphed engine gives
the eager engine's."""

import pytest
from lora_adapters import merged_greedy
from lora_files import write_adapter

from fastpath.runtime import LLM, LoRARequest, SamplingParams

pytestmark = pytest.mark.gpu  # tests/conftest.py skips it where no CUDA device is visible

PROMPTS = [[1, 5, 9, 33, 7], list(range(3, 60)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]] * 2
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def loras(hf_checkpoints, tmp_path_factory):
    root, base = tmp_path_factory.mktemp("lora-gpu"), hf_checkpoints["llama"]
    a = write_adapter(base, root / "a", 1, 8, ALL)
    b = write_adapter(base, root / "b", 2, 16, ["q_proj", "v_proj", "down_proj"], use_rslora=True)
    return [LoRARequest("a", 1, a), None, LoRARequest("b", 2, b), LoRARequest("a", 1, a)] * 2


def _tokens(base, loras, **kw):
    settings = dict(max_seq_len=256, max_batch_size=8, enable_lora=True, max_loras=2)
    with LLM(str(base), **settings, **kw) as llm:
        graphs = llm.executor.runner.graphs
        # The base steps and the steps with an adapter row have graphs of their own.
        assert graphs is None or {k for _, k in graphs.graphs} >= {"greedy", "lora_greedy"}
        graphs = graphs is not None
        return graphs, [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, lora_request=loras)]


def test_graphed_adapter_steps_give_the_merged_models_tokens(hf_checkpoints, loras):
    base = hf_checkpoints["llama"]
    graphs, got = _tokens(base, loras, device="cuda", dtype="float32")
    assert graphs
    for prompt, r, tokens in zip(PROMPTS, loras, got, strict=True):
        assert tokens == merged_greedy(base, r.lora_path if r else None, prompt, 24, "cuda")
    # A batch with no adapter replays the base graphs: the LoRA-off engine's tokens.
    with LLM(str(base), device="cuda", dtype="float32", max_seq_len=256, max_batch_size=8) as off:
        want = [o.outputs[0].token_ids for o in off.generate(PROMPTS, GREEDY)]
    assert _tokens(base, [None] * len(PROMPTS), device="cuda", dtype="float32")[1] == want


def test_bf16_graphs_give_the_eager_tokens_with_adapters(hf_checkpoints, loras):
    # Every batch size a graph of its own, as eager steps have, so both run the same kernel shapes.
    kw = dict(device="cuda", dtype="bfloat16", graph_batch_sizes=tuple(range(1, 9)),
              fmha_enabled=["triton_decode", "sdpa_math"])  # fmt: skip
    base = hf_checkpoints["llama"]
    assert _tokens(base, loras, enforce_eager=True, **kw)[1] == _tokens(base, loras, **kw)[1]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_shrink_and_expand_kernels_match_the_torch_ops_and_replay_in_a_graph(dtype):
    """On CUDA the deltas are two Triton launches (lora_kernels.py): close to TorchOps' three ops, a
    row with no adapter keeps `out`'s bits, a row's bits do not depend on the batch, and a graph of a
    projection's linear, shrink and expand, replayed, equals the eager launch (the arrival counts
    reset themselves)."""
    import torch

    from fastpath.runtime.kernels.torch_ops import TorchOps
    from fastpath.runtime.kernels.triton_ops import TritonOps

    dt, dev = getattr(torch, dtype), torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    t, f = TorchOps(), TritonOps()
    k, n, width, slots_n = 2048, 3072, 48, 2
    x = torch.randn(40, k, device=dev, generator=g).to(dt)
    w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(dt)
    a = (torch.randn(k, slots_n * width, device=dev, generator=g) * 0.02).to(dt)
    b = (torch.randn(slots_n * width, n, device=dev, generator=g) * 0.02).to(dt)
    slots = torch.tensor([(i % 3) - 1 for i in range(40)], device=dev)
    base = f.linear(x, w)
    got = f.lora_add(x, base.clone(), a, b, slots, width)
    ref = t.lora_add(x, base.clone(), a, b, slots, width)
    none = slots < 0
    assert torch.equal(got[none], base[none])
    err = (got[~none].float() - ref[~none].float()).norm() / (ref[~none].float() - base[~none].float()).norm()
    assert err < (2e-2 if dt == torch.bfloat16 else 1e-5)
    for m in (1, 8, 17):
        assert torch.equal(f.lora_add(x[:m], base[:m].clone(), a, b, slots[:m], width), got[:m])
    step = lambda: f.lora_add(x[:8], f.linear(x[:8], w), a, b, slots[:8], width)  # noqa: E731
    eager = step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)
