"""The half of a decoder layer after attention in one persistent launch (mlp_block.cu) on a CUDA device:
against the five ops it replaces, bit for bit across launches, PDL, graph replay and the rows beside a
row, and in the engine."""

import pytest
import torch

from fastpath.runtime import LLM, SamplingParams

pytestmark = pytest.mark.gpu

# (Q, H, I): the 1.24B Llama's, one with another ratio, and the 8B's (H = 4096: 256 o_proj and down_proj
# tiles, so blocks take several tiles in every phase).
SHAPES = [(2048, 2048, 8192), (1024, 2048, 3072), (4096, 4096, 14336)]


def _close(got: torch.Tensor, want: torch.Tensor, bound: float = 1e-2) -> bool:
    return float((got.float() - want.float()).norm() / want.float().norm()) < bound


@pytest.fixture(autouse=True)
def _needs_the_kernel():
    from fastpath.runtime.kernels import mlp_block

    if torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("the kernel needs compute capability 8.0 or newer")
    on, why = mlp_block.available(0)
    if not on and "shared memory" in why:
        pytest.skip(why)
    if not on:
        pytest.fail(f"mlp_block.cu did not build on this GPU: {why}")


def _layer(q: int, h: int, i: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) * scale

    weights = (
        rand(h, q, scale=q**-0.5),
        1 + 0.1 * rand(h),
        rand(2 * i, h, scale=h**-0.5),
        rand(h, i, scale=i**-0.5),
    )
    return g, rand, weights


def _run(attn, residual, weights, pdl=False):
    from fastpath.runtime.kernels import mlp_block

    wo, norm, wgu, wd = weights
    arrivals = torch.zeros(1, device="cuda", dtype=torch.int64)
    assert mlp_block.fits(attn, residual, wo, None, norm, wgu, wd)
    return mlp_block.mlp_block(attn, residual, wo, norm, 1e-5, wgu, wd, arrivals, pdl=pdl)


def _skip_unless_it_fits(rand, q, h, weights, warps):
    """16 warps split K in twice the shares, so a shape whose shares are not whole groups is not theirs."""
    from fastpath.runtime.kernels import mlp_block

    wo, norm, wgu, wd = weights
    if not mlp_block.fits(rand(1, q), rand(1, h), wo, None, norm, wgu, wd):
        pytest.skip(f"{warps} warps a block do not take Q={q}, H={h}, I={wd.shape[1]}")


@pytest.fixture(params=[8, 16], ids=["8 warps", "16 warps"])
def warps(request, monkeypatch):
    """mlp_block.WARPS: the build at 1-8 rows (9-16 rows keep 8 whatever it says)."""
    from fastpath.runtime.kernels import mlp_block

    monkeypatch.setattr(mlp_block, "WARPS", request.param)
    return request.param


@pytest.mark.parametrize("q,h,i", SHAPES)
def test_close_to_the_five_ops_and_the_same_bits_every_launch(q, h, i, warps):
    from fastpath.runtime.kernels.torch_ops import TorchOps

    _, rand, weights = _layer(q, h, i, q + h + i)
    wo, norm, wgu, wd = weights
    _skip_unless_it_fits(rand, q, h, weights, warps)
    for m in (1, 2, 8, 9, 16):
        attn, residual = rand(m, q), rand(m, h)
        runs = [_run(attn, residual, weights, pdl) for pdl in (False, True, False)]
        out, summed = runs[0]
        want_out, want_summed = TorchOps().mlp_block(attn, residual, wo, None, norm, 1e-5, wgu, wd)
        assert out.shape == (m, h) and summed.shape == (m, h)
        assert _close(summed, want_summed), m
        assert _close(out, want_out, 2e-2), m
        assert all(torch.equal(out, o) and torch.equal(summed, s) for o, s in runs[1:]), m


@pytest.mark.parametrize("q,h,i", SHAPES)
def test_the_ring_filled_by_whole_lines_gives_the_same_bits(q, h, i, warps):
    """FASTPATH_LINES moves which lane copies a weight piece, not the products or their order."""
    from fastpath.runtime.kernels import mlp_block

    _, rand, weights = _layer(q, h, i, 3 * q + h)
    _skip_unless_it_fits(rand, q, h, weights, warps)
    wo, norm, wgu, wd = weights
    arrivals = torch.zeros(1, device="cuda", dtype=torch.int64)
    for m in (1, 8, 9, 16):
        attn, residual = rand(m, q), rand(m, h)
        runs = [
            mlp_block.mlp_block(attn, residual, wo, norm, 1e-5, wgu, wd, arrivals, pdl=True, lines=lines)
            for lines in (False, True)
        ]
        assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True)), m


def test_a_row_gets_the_same_bits_whatever_rows_sit_beside_it():
    """Every output is one fixed sum, and each row's norm its own: batch composition changes no bit."""
    _, rand, weights = _layer(*SHAPES[0], 7)
    attn, residual = rand(16, SHAPES[0][0]), rand(16, SHAPES[0][1])
    full, full_summed = _run(attn, residual, weights)
    for lo, hi in ((0, 1), (0, 2), (0, 8), (3, 12), (7, 9), (15, 16)):
        out, summed = _run(attn[lo:hi].contiguous(), residual[lo:hi].contiguous(), weights)
        assert torch.equal(out, full[lo:hi]) and torch.equal(summed, full_summed[lo:hi]), (lo, hi)


def test_graph_replay_gives_the_eager_bits_under_pdl_with_launches_around_it(warps):
    """Two layers' halves and the ops between them captured once and replayed with new inputs: each
    launch reads what the one before it wrote, and the grid barrier's count stays in step."""
    from fastpath.runtime.kernels import mlp_block
    from fastpath.runtime.kernels.triton_ops import TritonOps

    q, h, i = SHAPES[0]
    _, rand, weights = _layer(q, h, i, 11)
    wo, norm, wgu, wd = weights
    ops = TritonOps()
    attn, residual = rand(8, q), rand(8, h)
    counters = [torch.zeros(1, device="cuda", dtype=torch.int64) for _ in range(2)]

    def two_layers():
        out, summed = residual, residual
        for counter in counters:
            x, summed = ops.add_rms_norm(out, summed, norm, 1e-5)
            out, summed = mlp_block.mlp_block(
                attn * x[:, :1], summed, wo, norm, 1e-5, wgu, wd, counter, pdl=True
            )
        return out, summed

    eager = two_layers()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = two_layers()
    torch.cuda.current_stream().wait_stream(stream)
    for k in range(3):
        if k:
            attn.copy_(rand(8, q))
            residual.copy_(rand(8, h))
            eager = two_layers()
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(captured, eager, strict=True)), k
    assert all(int(c) % mlp_block.sms(0) == 0 for c in counters)


def test_the_engine_takes_it_when_switched_on(monkeypatch):
    """With triton_ops.MLP_BLOCK on: the engine says so; a prompt's logits stay close to the five ops';
    and graph-replayed decode gives the eager engine's tokens."""
    from fastpath.runtime.kernels import mlp_block, triton_ops

    kw = dict(device="cuda", dtype="bfloat16", max_seq_len=128, max_batch_size=8)
    prompt = list(range(5, 17))  # 12 tokens: a prefill of 12 rows, which the kernel takes too
    with LLM("random:llama-1b", **kw) as off:
        want = off.prompt_logits(prompt)
    monkeypatch.setattr(triton_ops, "MLP_BLOCK", True)
    prompts = [list(range(3, 3 + n)) for n in (1, 17, 5, 9, 33, 2)]
    params = [SamplingParams(max_tokens=16, ignore_eos=True, temperature=t, seed=2) for t in (0, 0.9) * 3]
    outs = []
    # Prefill graphs off: a padded prefill runs other kernels (at 17-64 rows) than the eager one.
    for graphs in (False, True):
        graph_kw = dict(graph_batch_sizes=list(range(1, 9)), prefill_graphs=False) if graphs else {}
        with LLM("random:llama-1b", cuda_graphs=graphs, **graph_kw, **kw) as llm:
            assert "MLP half in one persistent launch on" in llm.executor.runner.model.ops.describe(
                torch.device("cuda", 0)
            )
            if not graphs:
                assert _close(llm.prompt_logits(prompt), want, 2e-2)
            outs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
            # It ran: each layer's grid barrier count moved, two barriers a launch.
            counts = [int(v) for k, v in llm.executor.runner.model.ops._counts.items() if k[0] == "mlp_block"]
            assert len(counts) == 16 and all(c > 0 and c % (2 * mlp_block.sms(0)) == 0 for c in counts)
    assert outs[0] == outs[1]
