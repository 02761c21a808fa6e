"""Which slice of each weight a tensor-parallel rank holds, Megatron-style.

Column-parallel (output rows split): q|k|v, with each rank taking its query heads and the key/value
heads they attend to, and gate|up. Row-parallel (input columns split): o_proj and down_proj, whose
partial outputs are summed by one all-reduce. Vocab-parallel: the embedding and the LM head, padded
so that every rank holds the same number of rows. Norms are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastpath.vocab import tensor_parallel_problems

from .config import ModelConfig


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    size: int

    @property
    def stop(self) -> int:
        return self.start + self.size


@dataclass(frozen=True, slots=True)
class Partition:
    """One rank's share of the model's heads, MLP width and vocabulary."""

    rank: int
    world: int
    q_heads: Span
    kv_heads: Span  # replicated across ranks when there are fewer KV heads than ranks
    intermediate: Span
    vocab: Span  # real rows; the rank allocates `vocab_rows` (padding rows stay zero)
    vocab_rows: int
    vocab_size: int  # of the whole model


def tp_problems(cfg: ModelConfig, world: int) -> list[str]:
    """Why `cfg` cannot be split across `world` ranks; empty when it can (the compiler asks the same rule)."""
    return tensor_parallel_problems(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, world)


def partition(cfg: ModelConfig, rank: int, world: int) -> Partition:
    problems = tp_problems(cfg, world)
    if problems:
        raise ValueError(f"{cfg.name}: cannot shard across {world} ranks: " + "; ".join(problems))
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a tensor-parallel group of {world}")
    heads = cfg.num_heads // world
    if cfg.num_kv_heads >= world:
        kv = cfg.num_kv_heads // world
        kv_heads = Span(rank * kv, kv)
    else:  # each KV head serves world / num_kv_heads consecutive ranks
        kv_heads = Span(rank * cfg.num_kv_heads // world, 1)
    inter = cfg.intermediate_size // world
    rows = -(-cfg.vocab_size // world)
    start = min(rank * rows, cfg.vocab_size)
    return Partition(
        rank=rank,
        world=world,
        q_heads=Span(rank * heads, heads),
        kv_heads=kv_heads,
        intermediate=Span(rank * inter, inter),
        vocab=Span(start, min(rows, cfg.vocab_size - start)),
        vocab_rows=rows,
        vocab_size=cfg.vocab_size,
    )


def local_config(cfg: ModelConfig, part: Partition) -> ModelConfig:
    """The shapes one rank's decoder layers are built with (the vocabulary is split separately)."""
    return cfg.replace(
        num_heads=part.q_heads.size,
        num_kv_heads=part.kv_heads.size,
        intermediate_size=part.intermediate.size,
    )
