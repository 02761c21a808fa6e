"""Tensor-parallel sharding without processes: which heads, rows and columns each rank holds, that the
shards put together are the unsharded weights, and that a rank reads only its slices of a checkpoint."""

from typing import ClassVar

import pytest
import torch
from safetensors import safe_open

import fastpath.runtime.model.weights as weights
from fastpath.runtime.model.collectives import TPContext
from fastpath.runtime.model.config import ModelConfig
from fastpath.runtime.model.presets import PRESETS
from fastpath.runtime.model.sharding import Span, partition, tp_problems
from fastpath.runtime.model.weights import build_model

CPU = torch.device("cpu")


def _cfg(**kw) -> ModelConfig:
    return PRESETS["tiny-llama"].replace(random_seed=7, **kw)


def test_query_heads_split_and_kv_heads_split_or_replicate():
    gqa = [partition(_cfg(num_heads=4, num_kv_heads=2), r, 2) for r in range(2)]
    assert [(p.q_heads, p.kv_heads) for p in gqa] == [(Span(0, 2), Span(0, 1)), (Span(2, 2), Span(1, 1))]
    mqa = [partition(_cfg(num_heads=4, num_kv_heads=1), r, 2) for r in range(2)]
    assert [p.kv_heads for p in mqa] == [Span(0, 1), Span(0, 1)]
    # 8 query heads over 2 KV heads on 4 ranks: each KV head serves the two ranks whose queries use it.
    four = [partition(_cfg(num_heads=8, num_kv_heads=2), r, 4) for r in range(4)]
    assert [p.kv_heads.start for p in four] == [0, 0, 1, 1]
    for p in four:
        group = 8 // 2
        assert {q // group for q in range(p.q_heads.start, p.q_heads.stop)} == {p.kv_heads.start}


def test_vocabulary_is_padded_so_every_rank_holds_as_many_rows():
    parts = [partition(_cfg(vocab_size=383), r, 2) for r in range(2)]
    assert [p.vocab_rows for p in parts] == [192, 192]
    assert [p.vocab for p in parts] == [Span(0, 192), Span(192, 191)]


@pytest.mark.parametrize(
    ("changes", "world", "message"),
    [
        (
            dict(num_heads=4, num_kv_heads=2),
            3,
            "num_attention_heads 4 is not divisible by tensor_parallel_size 3",
        ),
        (dict(num_heads=6, num_kv_heads=3, head_dim=16), 2, "num_key_value_heads 3 is not divisible"),
        (dict(num_heads=8, num_kv_heads=2), 8, None),
        (dict(num_heads=12, num_kv_heads=3), 4, "not a multiple of num_key_value_heads 3"),
        (dict(intermediate_size=161), 2, "intermediate_size 161 is not divisible"),
    ],
)
def test_unshardable_configs_name_the_field(changes, world, message):
    problems = tp_problems(_cfg(**changes), world)
    if message is None:
        assert problems == []
    else:
        assert any(message in p for p in problems), problems
        with pytest.raises(ValueError, match=message):
            partition(_cfg(**changes), 0, world)


def expected_shard(name: str, full: torch.Tensor, cfg: ModelConfig, rank: int, world: int) -> torch.Tensor:
    """Megatron's split written out directly, independent of sharding.py."""
    d, heads, kv, inter = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    q_rows = slice(rank * heads // world * d, (rank + 1) * heads // world * d)
    kv_head = rank * kv // world if kv < world else None
    kv_rows = (
        slice(kv_head * d, (kv_head + 1) * d)
        if kv_head is not None
        else slice(rank * kv // world * d, (rank + 1) * kv // world * d)
    )
    mlp = slice(rank * inter // world, (rank + 1) * inter // world)
    if "qkv_proj" in name:
        q, k, v = full.split([heads * d, kv * d, kv * d])
        return torch.cat([q[q_rows], k[kv_rows], v[kv_rows]])
    if "gate_up_proj" in name:
        gate, up = full.chunk(2)
        return torch.cat([gate[mlp], up[mlp]])
    if name.endswith("o_proj.weight"):
        return full[:, q_rows]
    if name.endswith("o_proj.bias"):
        return full if rank == 0 else torch.zeros_like(full)
    if "down_proj" in name:
        return full[:, mlp]
    if name in ("embed_tokens.weight", "lm_head.weight"):
        rows = -(-cfg.vocab_size // world)
        out = torch.zeros(rows, full.shape[1])
        mine = full[rank * rows : (rank + 1) * rows]
        out[: mine.shape[0]] = mine
        return out
    return full


CONFIGS = {
    "llama-gqa": _cfg(),
    "mqa-tied-odd-vocab": _cfg(num_kv_heads=1, vocab_size=383),
    "qwen2-bias": PRESETS["tiny-qwen2"].replace(random_seed=1),
    "qwen3-qk-norm": PRESETS["tiny-qwen3"].replace(random_seed=2),
    "llama-attention-bias": _cfg(qkv_bias=True, o_bias=True, tie_word_embeddings=False),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_shards_put_together_are_the_unsharded_weights(name):
    cfg = CONFIGS[name]
    full = dict(build_model(cfg, None, torch.float32, CPU, 64).named_parameters())
    for rank in range(2):
        shard = build_model(cfg, None, torch.float32, CPU, 64, tp=TPContext(rank, 2))
        for pname, param in shard.named_parameters():
            want = expected_shard(pname, full[pname], cfg, rank, 2)
            assert torch.equal(param, want), f"{name}: rank {rank} {pname}"


class _CountingSlice:
    def __init__(self, inner, log):
        self.inner, self.log = inner, log

    def get_shape(self):
        return self.inner.get_shape()

    def __getitem__(self, index):
        t = self.inner[index]
        self.log.append(t.numel())
        return t


class _CountingOpen:
    """safe_open that counts the elements read through get_slice and refuses whole-tensor reads."""

    read: ClassVar[list[int]] = []

    def __init__(self, *args, **kwargs):
        self.inner = safe_open(*args, **kwargs)

    def __enter__(self):
        self.handle = self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    def keys(self):
        return self.handle.keys()

    def get_slice(self, name):
        return _CountingSlice(self.handle.get_slice(name), self.read)

    def get_tensor(self, name):
        raise AssertionError(f"{name} was read whole")


@pytest.mark.parametrize("arch", ["llama", "llama-tied-mqa", "qwen2", "qwen3"])
def test_a_rank_reads_only_its_slices_of_a_checkpoint(hf_checkpoints, arch, monkeypatch):
    path = hf_checkpoints[arch]
    cfg = ModelConfig.from_dir(path)
    full = dict(build_model(cfg, path, torch.float32, CPU, 64).named_parameters())
    monkeypatch.setattr(weights, "safe_open", _CountingOpen)
    _CountingOpen.read = []
    shard = build_model(cfg, path, torch.float32, CPU, 64, tp=TPContext(1, 2))
    held = 0
    for pname, param in shard.named_parameters():
        assert torch.equal(param, expected_shard(pname, full[pname], cfg, 1, 2)), f"{arch}: {pname}"
        held += param.numel()
    assert sum(_CountingOpen.read) == held  # the vocabulary divides evenly here: no padding rows
