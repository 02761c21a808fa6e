"""The tensor-core GEMV for 2-16 decode rows (mma_gemv.cu) on a CUDA device: against cuBLAS, bit for bit
across launches, PDL, graph replay and the rows beside a row, and the engine's use of it."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

# (N, K): the 1.24B Llama's o_proj, q|k|v and down_proj, then ragged ones: N not a multiple of the
# 16-row tile, K not a multiple of the 32-wide chunk nor of the 8 warps' shares.
SHAPES = [(2048, 2048), (3072, 2048), (2048, 8192), (1000, 264), (24, 4104)]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2


def _one_rounding(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Every element within two bf16 ulps (2**-6) of its rotation pair's magnitude: the two launches
    round q|k|v and then RoPE's outputs, the epilogue rounds once, and each rounding is at most half an
    ulp (2**-8) of the pair.

    RoPE turns each pair (x[i], x[i + half]) through an angle, so a rounding of its inputs or products
    is of the size of the pair, not of the output: where the rotation cancels, an output near zero can
    be off by more than its own ulp (the H200, round 25: -0.0322 against -0.0317 in a pair of size 1).
    A rotation keeps a pair's norm, so the bound holds whichever side computed it."""
    got, want = got.float(), want.float()
    half = want.shape[-1] // 2
    pair = torch.cat([want[..., :half], want[..., :half]], -1).square()
    pair += torch.cat([want[..., half:], want[..., half:]], -1).square()
    return bool(((got - want).abs() <= pair.sqrt() * 2.0**-6 + 1e-30).all())


@pytest.fixture(autouse=True)
def _needs_the_kernel():
    """Older than bf16 mma.sync (sm_80): skipped. From there on the kernel must build: a missing NVRTC or
    a failed build is a failure here, not a quiet fall-back."""
    from fastpath.runtime.kernels import mma_gemv

    if torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("the tensor-core GEMV needs compute capability 8.0 or newer")
    on, why = mma_gemv.available(0)
    if not on:
        pytest.fail(f"the tensor-core GEMV did not build on this GPU: {why}")


@pytest.mark.parametrize("n,k", SHAPES)
def test_close_to_cublas_and_the_same_bits_every_launch(n, k):
    from fastpath.runtime.kernels import mma_gemv

    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    for m in (2, 3, 8, 9, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        for b in (None, bias):
            runs = [mma_gemv.linear(x, w, b, pdl=pdl) for pdl in (False, True, False)]
            assert runs[0].shape == (m, n)
            assert _close(runs[0], F.linear(x, w, b)), (m, n, k, b is not None)
            assert all(torch.equal(runs[0], r) for r in runs[1:]), (m, n, k)


def test_a_row_gets_the_same_bits_whatever_rows_sit_beside_it():
    """Each output is one fixed sum over K, whatever M is: batch composition changes no bit."""
    from fastpath.runtime.kernels import mma_gemv

    g = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(3072, 2048, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    x = torch.randn(16, 2048, device="cuda", dtype=torch.bfloat16, generator=g)
    full = mma_gemv.linear(x, w)
    for m in (2, 5, 8, 9, 13):
        assert torch.equal(mma_gemv.linear(x[:m], w), full[:m]), m
    assert torch.equal(mma_gemv.linear(x[7:9], w), full[7:9])


def test_gated_matches_the_silu_mul_after_the_linear():
    from fastpath.runtime.kernels import mma_gemv
    from fastpath.runtime.kernels.torch_ops import TorchOps

    g = torch.Generator(device="cuda").manual_seed(2)
    w = torch.randn(2 * 8192, 2048, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    for m in (2, 8, 9, 16):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16, generator=g)
        # Round 22's ring and the 2x2 one the engine takes: the same sums, the same bits.
        rings = [mma_gemv.linear(x, w, gated=True, pdl=True, unroll=u, stages=s) for u, s in ((1, 4), (2, 2))]
        got = rings[0]
        assert got.shape == (m, 8192) and torch.equal(rings[0], rings[1]), m
        assert _close(got, TorchOps().gated_linear(x, w)), m
        # The same products as the plain build, rounded and combined as silu_mul rounds them.
        apart = TorchOps().silu_mul(mma_gemv.linear(x, w))
        assert (got.float() - apart.float()).abs().max() <= 2**-7 * apart.float().abs().max(), m


def test_graph_replay_gives_the_eager_bits_under_pdl():
    from fastpath.runtime.kernels import mma_gemv

    g = torch.Generator(device="cuda").manual_seed(3)
    ws = [torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(3)]
    x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16, generator=g)

    def chain(x):  # each launch reads what the one before it wrote: the PDL wait must hold
        for w in ws:
            x = mma_gemv.linear(x, w, pdl=True) * 8
        return x

    eager = chain(x)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = chain(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    x.copy_(torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16, generator=g))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, chain(x))


def test_the_engine_takes_it_at_two_to_sixteen_rows_and_falls_back_elsewhere(monkeypatch):
    from fastpath.runtime.kernels import mma_gemv
    from fastpath.runtime.kernels.triton_ops import TritonOps

    ops = TritonOps()
    g = torch.Generator(device="cuda").manual_seed(4)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    x = torch.randn(16, 2048, device="cuda", dtype=torch.bfloat16, generator=g)
    assert torch.equal(ops.linear(x[:8], w), mma_gemv.linear(x[:8], w))
    assert "tensor-core GEMV on" in ops.describe(torch.device("cuda", 0))
    # What the kernel does not take goes to the other paths, and is still right; a strided x it takes.
    odd = torch.randn(2048, 2044, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    assert not mma_gemv.fits(x[:8, :2044], odd, None)  # K not a multiple of 8
    assert _close(ops.linear(x[:8, :2044].contiguous(), odd), F.linear(x[:8, :2044], odd))
    assert not mma_gemv.fits(x[:8, 1:2041], w[:, :2040], None)  # rows not 16-byte aligned
    assert not mma_gemv.fits(x.float(), w.float(), None)
    # gate_up_proj of the 1.24B Llama is past MAX_WEIGHT: with FASTPATH_MMA_GATED=0 (GATED_MAX_WEIGHT
    # MAX_WEIGHT) cuBLAS, then the SiLU-mul kernel; by default (67M, a 2x2 ring) the gated build, the SiLU-mul
    # in its epilogue.
    gate_up = torch.randn(2 * 8192, 2048, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    monkeypatch.setattr(mma_gemv, "GATED_MAX_WEIGHT", mma_gemv.MAX_WEIGHT)
    assert gate_up.numel() > mma_gemv.MAX_WEIGHT and not mma_gemv.fits(x[:8], gate_up, None)
    assert torch.equal(ops.gated_linear(x[:8], gate_up), ops.silu_mul(F.linear(x[:8], gate_up)))
    monkeypatch.setattr(mma_gemv, "GATED_MAX_WEIGHT", 1 << 26)
    assert mma_gemv.fits(x[:8], gate_up, None, gated=True)
    on = ops.gated_linear(x[:8], gate_up)
    assert torch.equal(on, mma_gemv.linear(x[:8], gate_up, gated=True, pdl=True, unroll=2, stages=2))
    assert _close(on, ops.silu_mul(F.linear(x[:8], gate_up)))
    assert torch.equal(ops.linear(x[:8], gate_up), F.linear(x[:8], gate_up))  # a plain linear stays on cuBLAS
    # Past GATED_MAX_WEIGHT (71M elements): cuBLAS, then the SiLU-mul kernel.
    big = torch.randn(2 * 17408, 2048, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    assert big.numel() > mma_gemv.GATED_MAX_WEIGHT and not mma_gemv.fits(x[:8], big, None, gated=True)
    assert torch.equal(ops.gated_linear(x[:8], big), ops.silu_mul(F.linear(x[:8], big)))
    assert _close(ops.linear(x[:, :2040], w[:, :2040]), F.linear(x[:, :2040], w[:, :2040]))


def _rope_tables(dim: int, positions: int = 4096):
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))
    freqs = torch.arange(positions, device="cuda").float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().contiguous(), emb.sin().contiguous()


# (heads, kv_heads, dim) at hidden 2048: the 1.24B Llama's, and Qwen2-style 128-wide heads.
ROPE_SHAPES = [(32, 8, 64), (16, 2, 128)]


@pytest.mark.parametrize("shape", ROPE_SHAPES)
def test_rope_epilogue_is_the_linear_then_the_rope_kernel_to_two_roundings(shape, monkeypatch):
    """triton_ops.MMA_ROPE's one launch against mma_gemv.linear then qkv_rope_cache_kernel, with and
    without bias, under PDL, and through the engine's op: q and the key cache within two bf16
    roundings of each rotation pair, the value cache equal. Not bit for bit: the H200 (rounds 24 and
    25) showed the two launches' extra rounding, which is one reason the build stays off."""
    from fastpath.runtime.kernels import mma_gemv, triton_ops
    from fastpath.runtime.kernels.torch_ops import TorchOps

    heads, kv_heads, dim = shape
    n, k, slots_total = (heads + 2 * kv_heads) * dim, 2048, 512
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    cos, sin = _rope_tables(dim)
    caches = torch.randn(2, slots_total, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    ops = triton_ops.TritonOps()
    for m in (2, 8, 9, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        positions = torch.randint(0, 4096, (m,), device="cuda", generator=g)
        slots = torch.randperm(slots_total, device="cuda", generator=g)[:m]
        for b in (None, bias):
            kc, vc = caches.clone().unbind(0)
            kc_ref, vc_ref = caches.clone().unbind(0)
            assert mma_gemv.fits_rope(x, w, b, positions, slots, cos, sin, kc, vc, shape)
            q = mma_gemv.linear_rope_cache(x, w, b, positions, slots, cos, sin, kc, vc, shape, pdl=True)
            qkv = mma_gemv.linear(x, w, b)
            q_ref = ops.qkv_rope_cache(
                qkv, positions, cos, sin, None, None, 1e-6, kc_ref, vc_ref, slots, shape
            )
            label = (shape, m, b is not None)
            assert _one_rounding(q, q_ref), label
            assert _one_rounding(kc, kc_ref), label
            assert torch.equal(vc, vc_ref), label  # no RoPE: both round the same sum once
            # And both right: plain torch's projection and RoPE, to bf16 rounding.
            kc_t, vc_t = caches.clone().unbind(0)
            q_t = TorchOps().qkv_linear_rope_cache(
                x, w, b, positions, cos, sin, None, None, 1e-6, kc_t, vc_t, slots, shape
            )
            assert _close(q, q_t) and _close(kc[slots], kc_t[slots]) and _close(vc[slots], vc_t[slots]), label
        # The engine's op takes it when MMA_ROPE is on, and gives the same bits as when it is off.
        outs = []
        for on in (False, True):
            monkeypatch.setattr(triton_ops, "MMA_ROPE", on)
            kc, vc = caches.clone().unbind(0)
            q = ops.qkv_linear_rope_cache(
                x, w, None, positions, cos, sin, None, None, 1e-6, kc, vc, slots, shape
            )
            outs.append((q, kc, vc))
        assert all(_one_rounding(off, on) for off, on in zip(*outs, strict=True)), m
    assert "q|k|v RoPE in its epilogue" in ops.describe(torch.device("cuda", 0))


def test_rope_epilogue_replays_in_a_graph_with_new_positions():
    """Captured once, replayed after the positions, slots and x change: the eager bits each time."""
    from fastpath.runtime.kernels import mma_gemv

    heads, kv_heads, dim = shape = ROPE_SHAPES[0]
    n, k = (heads + 2 * kv_heads) * dim, 2048
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    cos, sin = _rope_tables(dim)
    x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16, generator=g)
    positions = torch.randint(0, 4096, (8,), device="cuda", generator=g)
    slots = torch.randperm(256, device="cuda", generator=g)[:8]
    kc, vc = torch.zeros(2, 256, kv_heads, dim, device="cuda", dtype=torch.bfloat16).unbind(0)

    def step():
        return mma_gemv.linear_rope_cache(x, w, None, positions, slots, cos, sin, kc, vc, shape, pdl=True)

    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = step()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        x.copy_(torch.randn(8, k, device="cuda", dtype=torch.bfloat16, generator=g))
        positions.copy_(torch.randint(0, 4096, (8,), device="cuda", generator=g))
        slots.copy_(torch.randperm(256, device="cuda", generator=g)[:8])
        graph.replay()
        torch.cuda.synchronize()
        replayed = (out.clone(), kc[slots].clone(), vc[slots].clone())
        eager = step()
        assert torch.equal(replayed[0], eager)
        assert torch.equal(replayed[1], kc[slots]) and torch.equal(replayed[2], vc[slots])


@pytest.mark.parametrize("n,k", SHAPES)
def test_the_ring_filled_by_whole_lines_gives_the_same_bits(n, k, monkeypatch):
    """FASTPATH_LINES moves which lane copies a piece of the weight, not the products or their order: plain,
    with bias, gated on both rings, at 16 warps, and the RoPE build, the same bits as the per-lane ring
    (ragged N and K among the shapes: zero-filled pieces land where the other ring puts them)."""
    from fastpath.runtime.kernels import mma_gemv

    g = torch.Generator(device="cuda").manual_seed(11 * n + k)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    w2 = torch.randn(2 * n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    for m in (2, 8, 9, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        builds = [
            (w, None, {"pdl": True}),
            (w, bias, {}),
            (w, None, {"warps": 16}),
            (w2, None, {"gated": True, "unroll": 1, "stages": 4}),
            (w2, None, {"gated": True, "unroll": 2, "stages": 2}),
        ]
        for weight, b, options in builds:
            runs = [mma_gemv.linear(x, weight, b, lines=lines, **options) for lines in (False, True)]
            assert torch.equal(*runs), (n, k, m, options, b is not None)
    heads, kv_heads, dim = shape = ROPE_SHAPES[0]
    w = (
        torch.randn((heads + 2 * kv_heads) * dim, 2048, device="cuda", dtype=torch.bfloat16, generator=g)
        * 0.02
    )
    x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16, generator=g)
    positions = torch.randint(0, 4096, (8,), device="cuda", generator=g)
    slots = torch.randperm(64, device="cuda", generator=g)[:8]
    cos, sin = _rope_tables(dim)
    outs = []
    for lines in (False, True):
        monkeypatch.setattr(mma_gemv, "LINES", lines)
        kc, vc = torch.zeros(2, 64, kv_heads, dim, device="cuda", dtype=torch.bfloat16).unbind(0)
        q = mma_gemv.linear_rope_cache(x, w, None, positions, slots, cos, sin, kc, vc, shape)
        outs.append((q, kc, vc))
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
