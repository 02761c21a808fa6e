"""Tensor parallelism on the CPU (gloo, 2 processes): the same tokens as one rank."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.model.presets import PRESETS

PROMPTS = [[1, 5, 9, 33, 7], list(range(3, 60)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
CPU32 = dict(device="cpu", dtype="float32", max_seq_len=256, max_batch_size=4)


def _tokens(llm, prompts=PROMPTS, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


# llama: GQA, one KV head per rank; llama-tied-mqa: one KV head, replicated, and tied embeddings;
# qwen2: q/k/v biases; qwen3: q/k norms; mistral: a sliding window shorter than the long prompt.
@pytest.mark.parametrize("arch", ["llama", "llama-tied-mqa", "qwen2", "qwen3", "mistral"])
def test_tp2_greedy_tokens_equal_tp1(hf_checkpoints, arch):
    path = str(hf_checkpoints[arch])
    want = _tokens(LLM(path, **CPU32))
    with LLM(path, tensor_parallel_size=2, **CPU32) as llm:
        assert llm.parallel.world == 2 and llm.is_driver
        assert _tokens(llm) == want


@pytest.mark.slow
def test_tp2_equals_tp1_through_chunking_preemption_sampling_and_an_odd_vocabulary():
    """Rank 0's scheduler chunks prefills and preempts; random sampling with seeds and logprobs; a
    vocabulary that does not divide across the ranks (the last rank holds a padding row)."""
    cfg = PRESETS["tiny-llama"].replace(vocab_size=511, random_seed=5)
    kw = dict(CPU32, max_num_batched_tokens=24, kv_cache_blocks=8, max_seq_len=96)
    prompts = [list(range(3, 40)), [1, 2, 3], [9] * 20, [4, 5]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=True),
        SamplingParams(max_tokens=24, temperature=0.9, top_k=40, seed=11, ignore_eos=True, logprobs=True),
        SamplingParams(max_tokens=24, temperature=1.2, top_p=0.8, seed=3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    ]
    one = LLM(cfg, **kw)
    want = one.generate(prompts, params)
    want_logits = one.prompt_logits(prompts[0])
    with LLM(cfg, tp=2, **kw) as llm:
        got = llm.generate(prompts, params)
        got_logits = llm.prompt_logits(prompts[0])
        assert llm.executor.scheduler.num_preemptions > 0, "the cache is small enough to preempt"
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    for a, b in zip(got, want, strict=True):
        a, b = a.outputs[0], b.outputs[0]
        if b.logprobs is not None:
            assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-3)
            for pa, pb in zip(a.logprobs, b.logprobs, strict=True):
                assert {t: x.logprob for t, x in pa.items()} == pytest.approx(
                    {t: x.logprob for t, x in pb.items()}, abs=1e-4
                )
    assert torch.allclose(got_logits, want_logits, atol=1e-4)


def test_tensor_parallel_sizes_the_heads_cannot_take_are_refused():
    with pytest.raises(ValueError, match="num_attention_heads 4 is not divisible by tensor_parallel_size 3"):
        LLM("random:tiny-llama", device="cpu", tp=3)
    with pytest.raises(ValueError, match="tp=2 and tensor_parallel_size=4 disagree"):
        LLM("random:tiny-llama", device="cpu", tp=2, tensor_parallel_size=4)


@pytest.mark.slow
def test_torchrun_ranks_each_build_the_engine_and_rank_0_gets_the_tokens(tmp_path):
    script = Path(__file__).with_name("tp_torchrun.py")
    out = tmp_path / "tokens.json"
    env = {**os.environ, "FASTPATH_PROGRESS": "0"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    result = subprocess.run(
        [*cmd, str(script), str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["rank1_outputs"] == []
    one = LLM("random:tiny-llama", device="cpu", max_seq_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=got["max_tokens"], ignore_eos=True)
    assert got["tokens"] == _tokens(one, got["prompts"], params)


def test_tp4_on_gloo_equals_tp1():
    """Any power of two: four ranks, with the KV heads (2) replicated across them."""
    kw = dict(CPU32, max_seq_len=96)
    prompts, params = PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = _tokens(LLM("random:tiny-llama", **kw), prompts, params)
    with LLM("random:tiny-llama", tp=4, **kw) as llm:
        assert llm.parallel.world == 4 and llm.parallel.tp.allreduce_path == "gloo (CPU)"
        assert _tokens(llm, prompts, params) == want


def test_nvlink_multicast_is_turned_off_and_never_on(monkeypatch):
    from fastpath.vocab import MULTICAST_OFF_ENV

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # someone turned it on: the engine turns it off
    monkeypatch.delenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", raising=False)
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")
    with LLM("random:tiny-llama", tp=2, **CPU32):
        assert {k: os.environ.get(k) for k in MULTICAST_OFF_ENV} == MULTICAST_OFF_ENV
    assert {k: os.environ.get(k) for k in MULTICAST_OFF_ENV} == MULTICAST_OFF_ENV
    assert MULTICAST_OFF_ENV == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"
    }  # fmt: skip


def test_an_unknown_all_reduce_path_is_refused():
    with pytest.raises(ValueError, match="tp_allreduce must be one of auto, nccl, got 'nvls'"):
        LLM("random:tiny-llama", device="cpu", tp=2, tp_allreduce="nvls")
