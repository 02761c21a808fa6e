"""The checkpoint name map: which HF tensors, and which slice of each, make up each of our parameters
on one tensor-parallel rank (the whole tensor with one rank)."""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig
from .sharding import Partition, Span


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
