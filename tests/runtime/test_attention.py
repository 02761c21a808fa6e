"""Every FMHA library computes the same attention over the paged cache; selection follows precedence with reasons."""

import pytest
import torch

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.attention.manager import FmhaManager, NoAttentionLibrary
from fastpath.runtime.attention.metadata import AttentionConfig, AttentionMetadata
from fastpath.runtime.attention.reference import ReferenceAttention
from fastpath.runtime.attention.registry import LIBRARIES, availability_report, create

HEADS, KV_HEADS, DIM, BLOCK = 8, 2, 16, 4
CPU_CFG = AttentionConfig("cpu", torch.float32, HEADS, KV_HEADS, DIM, None)


def _paged(lens: list[int], window: int | None, phase: str, query_lens: list[int] | None = None):
    gen = torch.Generator().manual_seed(sum(lens))
    width = max(-(-n // BLOCK) for n in lens) + 1
    nblocks = 1 + len(lens) * width
    k_cache = torch.randn(nblocks, BLOCK, KV_HEADS, DIM, generator=gen)
    v_cache = torch.randn(nblocks, BLOCK, KV_HEADS, DIM, generator=gen)
    perm = torch.randperm(nblocks - 1, generator=gen) + 1  # scattered pages, like a real allocator's
    tables = perm[: len(lens) * width].view(len(lens), width).int()
    qlens = query_lens or [1] * len(lens)
    q = torch.randn(sum(qlens), HEADS, DIM, generator=gen)
    meta = AttentionMetadata(
        phase,
        torch.zeros(sum(qlens), dtype=torch.int64),
        tables,
        torch.tensor(lens, dtype=torch.int32),
        query_lens=qlens,
        context_lens_host=lens,
        block_size=BLOCK,
        sliding_window=window,
    )
    return q, k_cache, v_cache, meta


def _cpu_libraries():
    names = [n for n, reasons in availability_report(list(LIBRARIES), device_type="cpu", dtype=torch.float32,
                                                      num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=DIM).items()
             if not reasons]  # fmt: skip
    assert {"reference", "sdpa_math", "sdpa_flash", "flex_attention"} <= set(names)
    return names


@pytest.mark.parametrize("name", _cpu_libraries())
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize(
    ("phase", "lens", "qlens"),
    [("decode", [7, 1, 13, 9], None), ("prefill", [6, 13], [6, 4]), ("prefill", [9], [9])],
)
def test_library_matches_reference(name, window, phase, lens, qlens):
    lib = create(name)
    assert lib.is_available(CPU_CFG) == []
    q, k, v, meta = _paged(lens, window, phase, qlens)
    shapes = meta.decode_shapes() if phase == "decode" else meta.prefill_shapes()
    assert lib.supports(shapes) == [], "on the CPU every available library takes these calls"
    expected = ReferenceAttention().forward(q, k, v, meta, DIM**-0.5)
    got = lib.forward(q, k, v, meta, DIM**-0.5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_reference_against_dense_softmax():
    q, k, v, meta = _paged([5], None, "decode")
    out = ReferenceAttention().forward(q, k, v, meta, 0.25)
    keys = k[meta.block_tables[0].long()].flatten(0, 1)[:5].repeat_interleave(4, 1)  # [5, H, D]
    vals = v[meta.block_tables[0].long()].flatten(0, 1)[:5].repeat_interleave(4, 1)
    probs = torch.softmax(torch.einsum("hd,khd->hk", q[0], keys) * 0.25, -1)
    torch.testing.assert_close(out[0], torch.einsum("hk,khd->hd", probs, vals))


def test_precedence_prepend_and_reasons():
    mgr = FmhaManager(
        CPU_CFG, enabled=["sdpa_efficient", "sdpa_math", "reference"], prepend=["flex_attention"]
    )
    assert mgr.order == ("flex_attention", "sdpa_efficient", "sdpa_math", "reference")
    assert "CUDA only" in mgr.unavailable["sdpa_efficient"][0]
    _, _, _, meta = _paged([3, 8], None, "decode")
    assert mgr.select(meta.decode_shapes()).name == "flex_attention"
    captured = AttentionMetadata(
        "decode", meta.slot_mapping, meta.block_tables, meta.context_lens, capturing=True
    )
    chosen = mgr.select(captured.decode_shapes())
    assert chosen.name == "sdpa_math"
    rejected = mgr.rejections[captured.decode_shapes()]
    assert "CUDA-graph capture" in rejected["flex_attention"][0]
    assert "sdpa_efficient" in rejected
    assert any("sdpa_math" in line for line in mgr.explain())


def test_no_library_supports_raises_with_every_reason():
    with pytest.raises(NoAttentionLibrary, match="sdpa_cudnn: sdpa_cudnn runs on CUDA only"):
        FmhaManager(CPU_CFG, enabled=["sdpa_cudnn"])
    mgr = FmhaManager(CPU_CFG, enabled=["triton_decode", "sdpa_math"])
    assert "triton_decode" in mgr.unavailable


@pytest.mark.parametrize(
    "order", [["reference"], ["sdpa_math"], ["flex_attention", "reference"], ["sdpa_flash"]]
)
def test_engine_tokens_do_not_depend_on_the_library(order):
    prompts = [[5, 6, 7], list(range(3, 40))]
    p = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    base = LLM("random:tiny-mistral", device="cpu", max_seq_len=64, fmha_enabled=["reference"]).generate(
        prompts, p
    )
    other = LLM("random:tiny-mistral", device="cpu", max_seq_len=64, fmha_enabled=order).generate(prompts, p)
    assert [o.outputs[0].token_ids for o in other] == [o.outputs[0].token_ids for o in base]


def test_a_refused_call_falls_through_to_the_next_library():
    from fastpath.runtime.attention.library import KernelRefused

    mgr = FmhaManager(CPU_CFG, enabled=["sdpa_math", "reference"])
    math = mgr.available["sdpa_math"]

    def refuse(*args, **kwargs):
        raise KernelRefused("sdpa_math has no kernel for this call")

    math.forward = refuse
    q, k, v, meta = _paged([3, 8], None, "decode")
    out = mgr.forward(meta.decode_shapes(), q, k, v, meta, 0.25)
    torch.testing.assert_close(out, ReferenceAttention().forward(q, k, v, meta, 0.25))
    assert mgr.refusals == {"sdpa_math": "sdpa_math has no kernel for this call"}
