"""The Llama-family decoder (Llama 2/3/3.x, Mistral, Qwen2, Qwen3) over a paged KV cache.

Projections are fused as they are loaded (q|k|v and gate|up), so a decode step issues one GEMV
where HF issues three or two.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention.manager import FmhaManager
from .attention.metadata import AttentionMetadata
from .config import ModelConfig
from .layers import RMSNorm, RotaryEmbedding, silu_and_mul


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

    def forward(self, x, positions, rope, kv, meta: AttentionMetadata, fmha: FmhaManager):
        cfg = self.cfg
        q, k, v = self.qkv_proj(x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(-1, cfg.num_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(positions, q, k)
        k_cache, v_cache = kv.k[self.layer], kv.v[self.layer]
        k_cache.view(-1, cfg.num_kv_heads, cfg.head_dim).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, cfg.num_kv_heads, cfg.head_dim).index_copy_(0, meta.slot_mapping, v)
        shapes = meta.decode_shapes() if meta.phase == "decode" else meta.prefill_shapes()
        out = fmha.select(shapes).forward(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(-1, cfg.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, positions, rope, kv, meta, fmha):
        # Residual adds in the model dtype, as HF does, so bf16 runs round alike.
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, kv, meta, fmha)
        return x + self.mlp(self.post_attention_layernorm(x))


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
        for layer in self.layers:
            hidden = layer(hidden, positions, self.rope, kv, meta, fmha)
        if logits_indices is not None:
            hidden = hidden[logits_indices]
        return self.lm_head(self.norm(hidden))
