"""Which slice of each weight a tensor-parallel rank holds, Megatron-style.

Column-parallel (output rows split): q|k|v, with each rank taking its query heads and the key/value
heads they attend to, and gate|up. Row-parallel (input columns split): o_proj and down_proj, whose
partial outputs are summed by one all-reduce. Vocab-parallel: the embedding and the LM head, padded
so that every rank holds the same number of rows. Norms are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig


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
    """Why `cfg` cannot be split across `world` ranks; empty when it can."""
    if world < 1:
        return [f"tensor_parallel_size must be >= 1, got {world}"]
    problems = []
    if cfg.num_heads % world:
        problems.append(
            f"num_attention_heads {cfg.num_heads} is not divisible by tensor_parallel_size {world}"
        )
    kv = cfg.num_kv_heads
    if kv >= world and kv % world:
        problems.append(f"num_key_value_heads {kv} is not divisible by tensor_parallel_size {world}")
    if kv < world and world % kv:
        problems.append(
            f"tensor_parallel_size {world} is not a multiple of num_key_value_heads {kv} "
            "(needed to replicate KV heads)"
        )
    if cfg.intermediate_size % world:
        problems.append(
            f"intermediate_size {cfg.intermediate_size} is not divisible by tensor_parallel_size {world}"
        )
    return problems


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


# --- the slices each parameter reads ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Piece:
    """Elements [start, stop) along `ParamSlices.dim` of one HF tensor."""

    source: str  # HF tensor name
    source_shape: tuple[int, ...]  # its full shape, as the config implies
    offset: int  # where the source begins inside the unsharded fused parameter, along dim
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class ParamSlices:
    """How one of our parameters is assembled on one rank: its pieces concatenated along `dim`."""

    pieces: tuple[Piece, ...]
    dim: int  # 0: output rows (column-parallel, vocab, replicated); 1: input columns (row-parallel)
    full_shape: tuple[int, ...]  # the parameter unsharded, as tp=1 holds it
    zeros: bool = False  # a row-parallel bias lives on rank 0; the other ranks hold zeros


def _whole(name: str, shape: tuple[int, ...]) -> ParamSlices:
    return ParamSlices((Piece(name, shape, 0, 0, shape[0]),), 0, shape)


def _columns(sources: list[tuple[str, int, Span]], tail: tuple[int, ...]) -> ParamSlices:
    """Column-parallel: each (HF tensor, its rows, this rank's span) contributes its span, in order."""
    pieces, offset = [], 0
    for name, rows, span in sources:
        pieces.append(Piece(name, (rows, *tail), offset, span.start, span.stop))
        offset += rows
    return ParamSlices(tuple(pieces), 0, (offset, *tail))


def _row_parallel(name: str, out: int, full_in: int, span: Span) -> ParamSlices:
    return ParamSlices((Piece(name, (out, full_in), 0, span.start, span.stop),), 1, (out, full_in))


def param_slices(cfg: ModelConfig, part: Partition) -> dict[str, ParamSlices]:
    """Our parameter name -> the HF tensor slices that make it on this rank."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q = Span(part.q_heads.start * d, part.q_heads.size * d)
    kv = Span(part.kv_heads.start * d, part.kv_heads.size * d)
    mlp = part.intermediate
    vocab = (Piece("model.embed_tokens.weight", (cfg.vocab_size, h), 0, part.vocab.start, part.vocab.stop),)
    out: dict[str, ParamSlices] = {
        "embed_tokens.weight": ParamSlices(vocab, 0, (cfg.vocab_size, h)),
        "norm.weight": _whole("model.norm.weight", (h,)),
    }
    if not cfg.tie_word_embeddings:
        head = (Piece("lm_head.weight", (cfg.vocab_size, h), 0, part.vocab.start, part.vocab.stop),)
        out["lm_head.weight"] = ParamSlices(head, 0, (cfg.vocab_size, h))
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        attn = f"{hf}.self_attn"
        qkv = [(cfg.q_size, q), (cfg.kv_size, kv), (cfg.kv_size, kv)]
        out[f"{ours}.self_attn.qkv_proj.weight"] = _columns(
            [(f"{attn}.{p}_proj.weight", rows, s) for p, (rows, s) in zip("qkv", qkv, strict=True)], (h,)
        )
        if cfg.qkv_bias:
            out[f"{ours}.self_attn.qkv_proj.bias"] = _columns(
                [(f"{attn}.{p}_proj.bias", rows, s) for p, (rows, s) in zip("qkv", qkv, strict=True)], ()
            )
        out[f"{ours}.self_attn.o_proj.weight"] = _row_parallel(f"{attn}.o_proj.weight", h, cfg.q_size, q)
        if cfg.o_bias:
            bias = _whole(f"{attn}.o_proj.bias", (h,))
            out[f"{ours}.self_attn.o_proj.bias"] = ParamSlices(bias.pieces, 0, (h,), zeros=part.rank != 0)
        if cfg.qk_norm:
            out[f"{ours}.self_attn.q_norm.weight"] = _whole(f"{attn}.q_norm.weight", (d,))
            out[f"{ours}.self_attn.k_norm.weight"] = _whole(f"{attn}.k_norm.weight", (d,))
        out[f"{ours}.mlp.gate_up_proj.weight"] = _columns(
            [(f"{hf}.mlp.gate_proj.weight", inter, mlp), (f"{hf}.mlp.up_proj.weight", inter, mlp)], (h,)
        )
        out[f"{ours}.mlp.down_proj.weight"] = _row_parallel(f"{hf}.mlp.down_proj.weight", h, inter, mlp)
        out[f"{ours}.input_layernorm.weight"] = _whole(f"{hf}.input_layernorm.weight", (h,))
        out[f"{ours}.post_attention_layernorm.weight"] = _whole(f"{hf}.post_attention_layernorm.weight", (h,))
    return out
