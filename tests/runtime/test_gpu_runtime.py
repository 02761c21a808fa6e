"""The runtime on a CUDA device: HF parity in fp32 and bf16, graphs against eager, fused kernels against torch."""

import pytest
import torch
from checkpoints import ARCHS
from oracle import hf_greedy, hf_logits_first_step, hf_margins

from fastpath.runtime import LLM, RuntimeHooks, SamplingParams
from fastpath.runtime.prologues import FusedDecodePrologue

pytestmark = pytest.mark.gpu

PROMPTS = [[1, 5, 9, 33, 7], list(range(3, 60)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
EXACT_GRAPHS = list(range(1, 9))  # a graph per batch size: replay sees the eager step's exact shapes


@pytest.mark.parametrize("arch", list(ARCHS))
def test_fp32_tokens_equal_hf_on_cuda(hf_checkpoints, arch):
    path = hf_checkpoints[arch]
    llm = LLM(str(path), device="cuda", dtype="float32", max_seq_len=256, max_batch_size=4)
    outs = llm.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(path, prompt, 32, device="cuda"), (
            f"{arch}, prompt of {len(prompt)}"
        )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_bf16_close_to_hf_then_equal_until_a_near_tie(hf_checkpoints, arch):
    """bf16: first-step logits no further from HF's bf16 run than bf16 rounding moves HF itself (twice its
    fp32-vs-bf16 distance); then equal greedy tokens up to the first step whose HF top-2 margin is within
    four times that rounding."""
    path = hf_checkpoints[arch]
    llm = LLM(str(path), device="cuda", dtype="bfloat16", max_seq_len=256, max_batch_size=4)
    outs = llm.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        hf16 = hf_logits_first_step(path, prompt, torch.bfloat16, "cuda")
        hf32 = hf_logits_first_step(path, prompt, torch.float32, "cuda")
        ours = llm.prompt_logits(prompt)
        rounding = float((hf16 - hf32).norm() / hf32.norm())
        assert float((ours - hf16).norm() / hf16.norm()) <= 2 * rounding + 1e-6
        ref = hf_greedy(path, prompt, 32, torch.bfloat16, "cuda")
        k = next(
            (i for i, (a, b) in enumerate(zip(out.outputs[0].token_ids, ref, strict=True)) if a != b), None
        )
        if k is not None:
            tie = 4 * float((hf16 - hf32).abs().max())
            margin = hf_margins(path, prompt, ref, torch.bfloat16, "cuda")[k]
            assert margin <= tie, (
                f"{arch}: diverged at step {k}, HF margin {margin:.3g} > near-tie bound {tie:.3g}"
            )


def _tokens(**kw):
    llm = LLM("random:tiny-llama", device="cuda", dtype="bfloat16", max_seq_len=256, max_batch_size=8, **kw)
    prompts = [list(range(3, 3 + n)) for n in (1, 17, 5, 64, 9, 33)]
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=t, seed=2) for t in (0, 0.9) * 3]
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    return out, llm


def test_graph_replayed_decode_equals_eager():
    fmha = ["triton_decode", "sdpa_math"]
    eager, _ = _tokens(cuda_graphs=False, fmha_enabled=fmha)
    graphs, llm = _tokens(cuda_graphs=True, graph_batch_sizes=EXACT_GRAPHS, fmha_enabled=fmha)
    kinds = 4 if llm.executor.guided is not None else 2  # greedy, general, and their guided twins
    assert llm.executor.graphs is not None and len(llm.executor.graphs.graphs) == kinds * len(EXACT_GRAPHS)
    assert graphs == eager


@pytest.mark.parametrize("loop", [False, True])
def test_hooks_with_graphs_give_the_all_off_tokens(loop):
    fmha = ["triton_decode", "sdpa_math"]
    base, _ = _tokens(cuda_graphs=True, graph_batch_sizes=EXACT_GRAPHS, fmha_enabled=fmha)
    prologue = FusedDecodePrologue()
    hooked, llm = _tokens(
        cuda_graphs=True,
        graph_batch_sizes=EXACT_GRAPHS,
        fmha_enabled=fmha,
        hooks=RuntimeHooks(loop_on_execution_stream=loop, decode_prologue=prologue),
        guided_backend="none",  # guided decoding gates the loop scope off (LOOP_VS_GUIDED)
    )
    assert llm.executor.runner.decode_from_embeds
    assert llm.executor.loop_gate()[0] is loop
    assert hooked == base


def _paged_case(dtype, window=None):
    from fastpath.runtime.attention.metadata import AttentionMetadata

    gen = torch.Generator(device="cuda").manual_seed(0)
    lens = [1, 17, 300, 64, 129]
    block, kvh, heads, dim = 16, 8, 32, 64
    width = 32
    nblocks = 1 + len(lens) * width
    k = torch.randn(nblocks, block, kvh, dim, generator=gen, device="cuda", dtype=dtype)
    v = torch.randn(nblocks, block, kvh, dim, generator=gen, device="cuda", dtype=dtype)
    tables = (torch.randperm(nblocks - 1, device="cuda", generator=gen)[: len(lens) * width] + 1).view(
        len(lens), -1
    )
    q = torch.randn(len(lens), heads, dim, generator=gen, device="cuda", dtype=dtype)
    meta = AttentionMetadata(
        "decode",
        torch.zeros(len(lens), dtype=torch.int64, device="cuda"),
        tables.int(),
        torch.tensor(lens, dtype=torch.int32, device="cuda"),
        context_lens_host=lens,
        block_size=block,
        sliding_window=window,
        capturing=True,
    )
    return q, k, v, meta


@pytest.mark.parametrize("window", [None, 40])
def test_triton_decode_matches_the_reference(window):
    from fastpath.runtime.attention.reference import ReferenceAttention
    from fastpath.runtime.attention.triton_decode import TritonDecodeAttention

    q, k, v, meta = _paged_case(torch.bfloat16, window)
    ref = ReferenceAttention().forward(q.float(), k.float(), v.float(), meta, 0.125)
    got = TritonDecodeAttention().forward(q, k, v, meta, 0.125).float()
    assert float((got - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.parametrize("window", [None, 40])
def test_triton_prefill_matches_the_reference_and_sdpa_engines_tokens(window):
    from fastpath.runtime.attention.metadata import AttentionMetadata
    from fastpath.runtime.attention.reference import ReferenceAttention
    from fastpath.runtime.attention.triton_prefill import TritonPrefillAttention

    gen = torch.Generator(device="cuda").manual_seed(3)
    qlens, ctxs, block, heads, kv_heads, dim = [128, 33, 1, 200], [128, 90, 77, 200], 16, 32, 8, 64
    width = -(-max(ctxs) // block)
    nblocks = 1 + len(qlens) * width
    k = torch.randn(nblocks, block, kv_heads, dim, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(nblocks, block, kv_heads, dim, generator=gen, device="cuda", dtype=torch.bfloat16)
    perm = torch.randperm(nblocks - 1, generator=gen, device="cuda")[: len(qlens) * width] + 1
    q = torch.randn(sum(qlens), heads, dim, generator=gen, device="cuda", dtype=torch.bfloat16)
    meta = AttentionMetadata(
        "prefill", torch.zeros(sum(qlens), dtype=torch.int64, device="cuda"), perm.view(len(qlens), -1).int(),
        torch.tensor(ctxs, dtype=torch.int32, device="cuda"), query_lens=qlens, context_lens_host=ctxs,
        block_size=block, sliding_window=window,
    )  # fmt: skip
    ref = ReferenceAttention().forward(q.float(), k.float(), v.float(), meta, 0.125)
    got = TritonPrefillAttention().forward(q, k, v, meta, 0.125).float()
    assert float((got - ref).norm() / ref.norm()) < 1e-2
    # In the engine: a prompt's logits with its prefill in this kernel are SDPA's, to bf16 rounding.
    prompt = [(7 * j) % 500 + 1 for j in range(130)]
    logits = []
    for fmha in (["triton_decode", "triton_prefill", "sdpa_math"], ["triton_decode", "sdpa_math"]):
        llm = LLM("random:tiny-llama", device="cuda", dtype="bfloat16", max_seq_len=256, fmha_enabled=fmha)
        logits.append(llm.executor.prompt_logits(prompt, every_position=True).float().cpu())
        llm.close()
    assert float((logits[0] - logits[1]).norm() / logits[1].norm()) < 2e-2


def test_mixed_batches_give_the_unmixed_tokens_with_graphs_and_the_overlap_loop():
    """fp32, so both schedules compute the same sums: decodes riding along a prefill, then graph
    replays launched before that step's tokens reach the host, change nothing."""
    prompts = [list(range(3, 3 + n)) for n in (70, 5, 33, 1, 48, 12)]
    params = [SamplingParams(max_tokens=20, ignore_eos=True, temperature=t, seed=4) for t in (0, 0.8) * 3]
    outs, kinds = [], []
    for mixed in (True, False):
        llm = LLM(
            "random:tiny-llama", device="cuda", dtype="float32", max_seq_len=256, max_batch_size=8,
            max_num_batched_tokens=24, mixed_batches=mixed,
        )  # fmt: skip
        outs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        stats = llm.stats()
        kinds.append(stats.step_tokens["prefill"] > sum(map(len, prompts)))
        llm.close()
    assert kinds == [True, False], "only the mixed engine's prefill steps computed decode tokens"
    assert outs[0] == outs[1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_admission_beside_a_step_in_flight_changes_no_token_with_graphs(monkeypatch, dtype):
    """Requests admitted while a decode graph runs: the riders' tokens go from that graph's output
    into the prefill step (a prefill graph in bf16) on the device. The host-synchronous admission
    runs the same batches, so the tokens and logprobs agree."""
    from test_admit_beside import PARAMS, PROMPTS

    from fastpath.runtime.engine.executor import ADMIT_BESIDE_ENV

    outs, pending_replays = [], []
    for beside in ("1", "0"):
        monkeypatch.setenv(ADMIT_BESIDE_ENV, beside)
        llm = LLM(
            "random:tiny-llama", device="cuda", dtype=dtype, max_seq_len=128, max_batch_size=4,
            max_num_batched_tokens=48, mixed_batches=True,
        )  # fmt: skip
        try:
            runner, seen = llm.executor.runner, []
            take = runner.take_pending
            runner.take_pending = lambda ids, pending, prev, seen=seen, take=take: (
                seen.append(pending is not None),
                take(ids, pending, prev),
            )
            outs.append(
                [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(PROMPTS, PARAMS)]
            )
            pending_replays.append(sum(seen))
            graphs = runner.prefill_graphs
            if dtype == "bfloat16":
                assert graphs is not None and graphs.replays > 0
        finally:
            llm.close()
    assert pending_replays[1] == 0 and pending_replays[0] > 0
    assert outs[0] == outs[1]
    assert [len(ids) for ids, reason in outs[0] if reason == "length"] == [
        p.max_tokens for p, (_, reason) in zip(PARAMS, outs[0], strict=True) if reason == "length"
    ]


def test_prefill_graphs_give_the_eager_prefills_logprobs():
    """bf16 (triton_prefill): prefill steps replayed from graphs, padded to their token bucket, give
    the eager steps' top-5 logprobs to bf16 rounding, for greedy and for penalized sampled rows."""
    prompts = [[(11 * j + n) % 500 + 3 for j in range(n)] for n in (70, 5, 33, 1, 48, 300)]  # vocab 512
    params = [
        SamplingParams(max_tokens=1, temperature=0.0, logprobs=5),
        SamplingParams(max_tokens=1, temperature=0.8, seed=1, repetition_penalty=1.3, logprobs=5),
    ]
    tops = {}
    for graphs in (False, True):
        llm = LLM(
            "random:tiny-llama", device="cuda", dtype="bfloat16", max_seq_len=512, max_batch_size=8,
            prefill_graphs=graphs,
        )  # fmt: skip
        replayed = llm.executor.runner.prefill_graphs
        assert (replayed is not None) == graphs
        outs = llm.generate(prompts, [params[i % 2] for i in range(len(prompts))])
        if graphs:
            assert replayed.replays >= 1
        tops[graphs] = [
            {t: lp.logprob for t, lp in o.outputs[0].logprobs[0].items() if lp.rank} for o in outs
        ]
        llm.close()
    for eager, graphed in zip(tops[False], tops[True], strict=True):
        common = set(eager) & set(graphed)
        assert len(common) >= 4, (eager, graphed)  # a near-tie may swap the fifth
        assert max(abs(eager[t] - graphed[t]) for t in common) < 0.05


def test_prefill_graphs_serve_a_continuous_batch_to_the_end():
    """More requests than rows, arriving as the engine decodes: mixed prefill steps replay their
    graphs between decode graphs, launched before the previous step's tokens reach the host."""
    llm = LLM("random:tiny-llama", device="cuda", dtype="bfloat16", max_seq_len=512, max_batch_size=8)
    try:
        graphs = llm.executor.runner.prefill_graphs
        assert graphs is not None and llm.executor.scheduler.mixed_batches
        prompts = [[(5 * j + i) % 500 + 3 for j in range(10 + 13 * i)] for i in range(24)]
        params = [SamplingParams(max_tokens=8 + i % 5, ignore_eos=True, temperature=0.7 * (i % 2), seed=i)
                  for i in range(24)]  # fmt: skip
        outs = llm.generate(prompts, params)
        assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]
        assert graphs.replays >= 3 and llm.stats().steps["prefill"] >= graphs.replays
    finally:
        llm.close()


def test_fused_ops_match_torch_ops():
    from fastpath.runtime.kernels.torch_ops import TorchOps
    from fastpath.runtime.kernels.triton_ops import TritonOps

    t, f = TorchOps(), TritonOps()
    g = torch.Generator(device="cuda").manual_seed(1)
    dt = torch.bfloat16
    x = torch.randn(5, 2048, device="cuda", dtype=dt, generator=g)
    r = torch.randn(5, 2048, device="cuda", dtype=dt, generator=g)
    w = 1 + 0.1 * torch.randn(2048, device="cuda", dtype=dt, generator=g)
    for res in (None, r):
        (a, sa), (b, sb) = t.add_rms_norm(x, res, w, 1e-5), f.add_rms_norm(x, res, w, 1e-5)
        assert torch.equal(sa, sb)
        assert (
            a.float() - b.float()
        ).abs().max() <= 2 * a.float().abs().max() * 2**-8  # at most an ulp apart
    gu = torch.randn(5, 2 * 4096, device="cuda", dtype=dt, generator=g)
    assert torch.equal(t.silu_mul(gu), f.silu_mul(gu))
    weight = torch.randn(3072, 2048, device="cuda", dtype=dt, generator=g) * 0.02
    one = x[:1]
    rel = (t.linear(one, weight).float() - f.linear(one, weight).float()).norm() / t.linear(
        one, weight
    ).float().norm()
    assert float(rel) < 1e-2
    # The MLP's gate_up at one row, the SiLU-mul in the GEMV's epilogue, against torch's ops.
    gate_up = torch.randn(2 * 8192, 2048, device="cuda", dtype=dt, generator=g) * 0.02
    want, got = t.gated_linear(one, gate_up).float(), f.gated_linear(one, gate_up).float()
    assert got.shape == (1, 8192) and float((got - want).norm() / want.norm()) < 1e-2
    for qk_norm in (False, True):
        heads, kvh, dim = 32, 8, 64
        qkv = torch.randn(7, (heads + 2 * kvh) * dim, device="cuda", dtype=dt, generator=g)
        pos = torch.tensor([0, 5, 9, 100, 3, 2, 1], device="cuda")
        ang = torch.randn(128, dim, device="cuda", generator=g)
        cos, sin = ang.cos(), ang.sin()
        qn = (1 + 0.1 * torch.randn(dim, device="cuda", generator=g)).to(dt) if qk_norm else None
        kn = (1 + 0.1 * torch.randn(dim, device="cuda", generator=g)).to(dt) if qk_norm else None
        caches = [torch.zeros(4, 16, kvh, dim, device="cuda", dtype=dt) for _ in range(4)]
        slots = torch.tensor([3, 17, 20, 40, 41, 60, 1], device="cuda")
        qa = t.qkv_rope_cache(
            qkv, pos, cos, sin, qn, kn, 1e-6, caches[0], caches[1], slots, (heads, kvh, dim)
        )
        qb = f.qkv_rope_cache(
            qkv, pos, cos, sin, qn, kn, 1e-6, caches[2], caches[3], slots, (heads, kvh, dim)
        )
        tol = 2**-7  # at most about one bf16 ulp of the largest value apart
        assert (qa.float() - qb.float()).abs().max() <= tol * qa.float().abs().max()
        assert torch.equal(caches[1], caches[3])
        assert (caches[0].float() - caches[2].float()).abs().max() <= tol * caches[0].float().abs().max()
    # One row: the q|k|v GEMV with RoPE and the cache write in its epilogue, against torch's ops; only
    # the row's slot written.
    heads, kvh, dim = 32, 8, 64
    weight = torch.randn((heads + 2 * kvh) * dim, 2048, device="cuda", dtype=dt, generator=g) * 0.02
    ang = torch.randn(128, dim, device="cuda", generator=g)
    args = (torch.tensor([77], device="cuda"), ang.cos(), ang.sin(), None, None, 1e-6)
    caches = [torch.zeros(4, 16, kvh, dim, device="cuda", dtype=dt) for _ in range(4)]
    slot = torch.tensor([45], device="cuda")
    qa = t.qkv_linear_rope_cache(one, weight, None, *args, caches[0], caches[1], slot, (heads, kvh, dim))
    qb = f.qkv_linear_rope_cache(one, weight, None, *args, caches[2], caches[3], slot, (heads, kvh, dim))
    for want, got in ((qa, qb), (caches[0], caches[2]), (caches[1], caches[3])):
        assert float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2
    written = caches[2].view(-1, kvh, dim).flatten(1).abs().sum(1) > 0
    assert written.nonzero()[:, 0].tolist() == [45]


@pytest.mark.parametrize("m", [2, 8, 17, 33, 64])
def test_small_m_linear_is_close_to_cublas_and_deterministic_under_split_k(m):
    """Every config of the small-M kernel at m rows, split-K ones among them: near cuBLAS, the same bits
    on every launch (the last program of a tile sums the partials in a fixed order), counts left at zero."""
    from fastpath.runtime.kernels import triton_kernels as K
    from fastpath.runtime.kernels.triton_ops import TritonOps

    ops = TritonOps()
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(2048, 8192, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    ref = torch.nn.functional.linear(x, w).float()
    block_m = next(b for b in K.SMALL_M_BLOCKS if m <= b)
    for cfg in K.small_m_configs(block_m, 8192):
        for pdl in (False, True):
            runs = [ops.small_m(x, w, None, cfg, pdl) for _ in range(3)]
            assert float((runs[0].float() - ref).norm() / ref.norm()) < 1e-2, (cfg, pdl)
            assert all(torch.equal(runs[0], r) for r in runs[1:]), (cfg, pdl)
            assert not ops._arrivals(w, 2048).any(), (cfg, pdl)
    tuned = ops.linear(x, w)
    assert float((tuned.float() - ref).norm() / ref.norm()) < 1e-2


def test_one_billion_parameter_llama_runs_with_graphs():
    llm = LLM("random:llama-1b", device="cuda", dtype="bfloat16", max_seq_len=512, max_batch_size=8)
    out = llm.generate(
        [list(range(100, 140)), [128000, 9906]],
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
    )
    assert all(len(o.outputs[0].token_ids) == 20 for o in out)
    assert llm.executor.graphs is not None
    logits = llm.prompt_logits([128000, 9906, 1917])
    assert torch.isfinite(logits).all() and logits.std() > 0


def _greedy_runs_1b(max_tokens: int):
    """Each greedy row's (tokens, cumulative logprob) from a fresh 1B engine with graphs: one prompt
    alone, then five at once."""
    prompts = [list(range(100, 140)), [128000, 9906], list(range(7, 300, 3)), [5] * 9, [42]]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    llm = LLM("random:llama-1b", device="cuda", dtype="bfloat16", max_seq_len=512, max_batch_size=8)
    try:
        return [
            [(o.outputs[0].token_ids, o.outputs[0].cumulative_logprob) for o in llm.generate(p, params)]
            for p in (prompts[:1], prompts)
        ]
    finally:
        llm.close()


def test_programmatic_dependent_launch_changes_no_logprob(monkeypatch):
    """The per-token kernels overlap under PDL (each GEMV reads weights before the wait for its input):
    the same tokens and the same log-probabilities, bit for bit, as launched one after the other."""
    from fastpath.runtime.kernels import triton_ops

    runs = {}
    for pdl in ("0", "1"):
        monkeypatch.setenv("FASTPATH_PDL", pdl)
        triton_ops.pdl_available.cache_clear()
        runs[pdl] = _greedy_runs_1b(max_tokens=24)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert triton_ops.pdl_available(torch.cuda.current_device())[0], "Hopper: PDL should be on"
    triton_ops.pdl_available.cache_clear()
    assert runs["0"] == runs["1"]


def test_attention_loads_before_its_wait_change_no_logprob(monkeypatch):
    """Under PDL decode attention reads earlier steps' keys and values before it waits for q|k|v, and
    the step's new key and value after: the same tokens and log-probabilities, bit for bit, as waiting
    first. A new key read before the wait would be the slot's stale one, and change them."""
    from fastpath.runtime.attention import triton_decode

    runs = {}
    for early in (False, True):
        monkeypatch.setattr(triton_decode, "EARLY_KV", early)
        runs[early] = _greedy_runs_1b(max_tokens=40)
    assert runs[False] == runs[True]
