"""The Llama-family decoder (Llama 2/3/3.x, Mistral, Qwen2, Qwen3) over a paged KV cache.

Projections are fused as they are loaded (q|k|v and gate|up), so a decode step issues one GEMV
where HF issues three or two. The per-token work goes through `ops` (kernels/): plain torch, or
fused Triton kernels on CUDA, with the same roundings either way.

Under tensor parallelism (`tp`, see parallel/) each rank builds the layers of its shard: its query and
KV heads, its slice of the MLP width and of the vocabulary. The only collectives are one all-reduce
after each row-parallel projection (o_proj, down_proj), one after the embedding lookup, and the
gather of the LM head's logits. With one rank they return their input untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.manager import FmhaManager
from ..attention.metadata import AttentionMetadata
from ..kernels import TorchOps
from .collectives import SINGLE, TPContext
from .config import ModelConfig
from .layers import RMSNorm, RotaryEmbedding
from .lora_table import LoRATable
from .sharding import Partition, local_config, partition


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp: TPContext) -> None:
        super().__init__()
        self.cfg = cfg  # this rank's heads
        self.layer = layer
        self.tp = tp
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim**-0.5

    def forward(self, x, positions, rope, kv, meta: AttentionMetadata, fmha: FmhaManager, ops, lora=None):
        """Normed hidden states -> attention output projected back to the hidden size. `lora`: the
        forward's LoRAPass (lora_table.py), whose deltas join the projections unfused."""
        out = self.attend(x, positions, rope, kv, meta, fmha, ops, lora)
        # Row-parallel: each rank's heads give a partial sum (o_proj's bias is held by rank 0 alone).
        o = ops.linear(out, self.o_proj.weight, self.o_proj.bias)
        if lora is not None:
            o = lora.add(self.layer, "o", out, o)
        return self.tp.all_reduce(o)

    def attend(self, x, positions, rope, kv, meta: AttentionMetadata, fmha: FmhaManager, ops, lora=None):
        """Normed hidden states -> the heads' attention outputs [tokens, q_size], before o_proj."""
        cfg = self.cfg
        k_cache, v_cache = kv.k[self.layer], kv.v[self.layer]
        rest = (
            positions,
            rope.cos,
            rope.sin,
            self.q_norm.weight if cfg.qk_norm else None,
            self.k_norm.weight if cfg.qk_norm else None,
            cfg.rms_norm_eps,
            k_cache,
            v_cache,
            meta.slot_mapping,
            (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
        )
        if lora is None:
            q = ops.qkv_linear_rope_cache(x, self.qkv_proj.weight, self.qkv_proj.bias, *rest)
        else:
            qkv = lora.add(self.layer, "qkv", x, ops.linear(x, self.qkv_proj.weight, self.qkv_proj.bias))
            q = ops.qkv_rope_cache(qkv, *rest)
        shapes = meta.decode_shapes() if meta.phase == "decode" else meta.prefill_shapes()
        return fmha.forward(shapes, q, k_cache, v_cache, meta, self.scale).reshape(-1, cfg.q_size)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp: TPContext) -> None:
        super().__init__()
        self.tp = tp
        self.layer = layer
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, act, ops, lora=None):
        """down_proj of silu(gate) * up, which the norm before it computes with gate_up_proj."""
        down = ops.linear(act, self.down_proj.weight)
        if lora is not None:
            down = lora.add(self.layer, "down", act, down)
        return self.tp.all_reduce(down)

    def gated(self, normed, ops, lora):
        """silu(gate) * up of normed inputs, with the LoRA deltas of gate and up."""
        gate_up = lora.add(self.layer, "gate_up", normed, ops.linear(normed, self.gate_up_proj.weight))
        return ops.silu_mul(gate_up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, tp: TPContext) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, layer, tp)

    def forward(self, x, residual, positions, rope, kv, meta, fmha, ops, lora=None):
        """(layer input, residual so far) -> (MLP output, residual); the add is fused into the next norm."""
        eps, attn = self.input_layernorm.eps, self.self_attn
        normed, residual = ops.add_rms_norm(x, residual, self.input_layernorm.weight, eps)
        # One GPU and no adapters: no all-reduce after o_proj, so the half after attention is one op.
        if lora is None and attn.tp.world == 1:
            out = attn.attend(normed, positions, rope, kv, meta, fmha, ops)
            mlp = self.mlp
            return ops.mlp_block(
                out, residual, attn.o_proj.weight, attn.o_proj.bias, self.post_attention_layernorm.weight, eps,
                mlp.gate_up_proj.weight, mlp.down_proj.weight,
            )  # fmt: skip
        h = attn(normed, positions, rope, kv, meta, fmha, ops, lora)
        if lora is None:
            act, residual = ops.add_rms_norm_gated_linear(
                h, residual, self.post_attention_layernorm.weight, eps, self.mlp.gate_up_proj.weight
            )
        else:
            normed, residual = ops.add_rms_norm(h, residual, self.post_attention_layernorm.weight, eps)
            act = self.mlp.gated(normed, ops, lora)
        return self.mlp(act, ops, lora), residual


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the vocabulary [start, start + size), padded to `rows` so every rank holds as many."""

    def __init__(self, part: Partition, hidden: int) -> None:
        super().__init__()
        self.start, self.size, self.sharded = part.vocab.start, part.vocab.size, part.world > 1
        self.weight = nn.Parameter(torch.empty(part.vocab_rows, hidden))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Rows of the ids this rank holds; zeros for the others, which the all-reduce fills in."""
        if not self.sharded:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        mine = (local >= 0) & (local < self.size)
        rows = F.embedding(torch.where(mine, local, 0), self.weight)
        return rows * mine[:, None].to(rows.dtype)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int, tp: TPContext = SINGLE) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        self.part = partition(cfg, tp.rank, tp.world)
        local = local_config(cfg, self.part)
        self.embed_tokens = VocabParallelEmbedding(self.part, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(local, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, self.part.vocab_rows, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(cfg, max_positions)
        self.ops = TorchOps()
        self.lora: LoRATable | None = None  # the engine's adapters (enable_lora), set by the runner

    def embed_local(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This rank's share of the embeddings: the whole lookup with one rank."""
        return self.embed_tokens(input_ids)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.embed_local(input_ids))

    def reduce_embeds(self, local: torch.Tensor) -> torch.Tensor:
        """A prologue's `embed_local` result -> the embeddings (a copy, so its buffer keeps its contents)."""
        return local if self.tp.world == 1 else self.tp.all_reduce(local.clone())

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv,
        meta: AttentionMetadata,
        fmha: FmhaManager,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Embedded inputs [T, H] -> logits of the rows in `logits_indices` (all rows when None)."""
        ops, residual = self.ops, None
        lora = self.lora.begin(hidden.shape[0], ops) if self.lora is not None and self.lora.active else None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, positions, self.rope, kv, meta, fmha, ops, lora)
        if logits_indices is not None:
            hidden, residual = hidden[logits_indices], residual[logits_indices]
        logits, _ = ops.add_rms_norm_linear(
            hidden, residual, self.norm.weight, self.norm.eps, self.lm_head.weight
        )
        return self.tp.gather_columns(logits, self.cfg.vocab_size)

    def final_hidden(self, hidden, positions, kv, meta: AttentionMetadata, fmha: FmhaManager) -> torch.Tensor:
        """Embedded inputs [T, H] -> the final norm's output at every token: what HF's base model
        returns as last_hidden_state, and what pooling reads (engine/pooling.py)."""
        ops, residual = self.ops, None
        lora = self.lora.begin(hidden.shape[0], ops) if self.lora is not None and self.lora.active else None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, positions, self.rope, kv, meta, fmha, ops, lora)
        return ops.add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps)[0]
