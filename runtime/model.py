"""The Llama-family decoder (Llama 2/3/3.x, Mistral, Qwen2, Qwen3) over a paged KV cache.

Projections are fused as they are loaded (q|k|v and gate|up), so a decode step issues one GEMV
where HF issues three or two. The per-token work goes through `ops` (kernels/): plain torch, or
fused Triton kernels on CUDA, with the same roundings either way.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention.manager import FmhaManager
from .attention.metadata import AttentionMetadata
from .config import ModelConfig
from .kernels import TorchOps
from .layers import RMSNorm, RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim**-0.5

    def forward(self, qkv, positions, rope, kv, meta: AttentionMetadata, fmha: FmhaManager, ops):
        """Projected q|k|v -> attention output projected back to the hidden size."""
        cfg = self.cfg
        k_cache, v_cache = kv.k[self.layer], kv.v[self.layer]
        q = ops.qkv_rope_cache(
            qkv,
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
        shapes = meta.decode_shapes() if meta.phase == "decode" else meta.prefill_shapes()
        out = fmha.forward(shapes, q, k_cache, v_cache, meta, self.scale)
        return ops.linear(out.reshape(-1, cfg.q_size), self.o_proj.weight, self.o_proj.bias)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, gate_up, ops):
        return ops.silu_mul_linear(gate_up, self.down_proj.weight)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, residual, positions, rope, kv, meta, fmha, ops):
        """(layer input, residual so far) -> (MLP output, residual); the add is fused into the next norm."""
        eps, attn = self.input_layernorm.eps, self.self_attn
        qkv, residual = ops.add_rms_norm_linear(
            x, residual, self.input_layernorm.weight, eps, attn.qkv_proj.weight, attn.qkv_proj.bias
        )
        h = attn(qkv, positions, rope, kv, meta, fmha, ops)
        gate_up, residual = ops.add_rms_norm_linear(
            h, residual, self.post_attention_layernorm.weight, eps, self.mlp.gate_up_proj.weight
        )
        return self.mlp(gate_up, ops), residual


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(cfg, max_positions)
        self.ops = TorchOps()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

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
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, positions, self.rope, kv, meta, fmha, ops)
        if logits_indices is not None:
            hidden, residual = hidden[logits_indices], residual[logits_indices]
        logits, _ = ops.add_rms_norm_linear(
            hidden, residual, self.norm.weight, self.norm.eps, self.lm_head.weight
        )
        return logits
