"""The torch.compile peer of bench/decode.py: a gpt-fast-style Llama, written here, nothing shared.

A static KV cache, SDPA, fused QKV and gate/up projections, and one decode step compiled with
`torch.compile(mode="reduce-overhead", fullgraph=True)` (Inductor's kernels captured in a CUDA
graph) with coordinate-descent tuning. This is the way gpt-fast runs a model. It reads a
transformers-style config dict, so the bench builds it from the same preset as fastpath's row,
and tests/test_compile_peer.py checks its greedy tokens against HF transformers on the CPU.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True, slots=True)
class PeerConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # llama3's, or None
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> PeerConfig:
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=d["num_attention_heads"],
            num_kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
            head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
            rms_norm_eps=d["rms_norm_eps"],
            rope_theta=theta,
            rope_scaling=rope if rope.get("rope_type") == "llama3" else None,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        )


def inv_frequencies(cfg: PeerConfig) -> torch.Tensor:
    """RoPE's inverse frequencies, with Llama 3's scaling (its published definition) when set."""
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    s = cfg.rope_scaling
    if s is None:
        return inv.float()
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
        s["high_freq_factor"] - s["low_freq_factor"]
    )
    scaled = torch.where(wavelen > low_wavelen, inv / s["factor"], inv)
    middle = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(middle, (1 - smooth) * inv / s["factor"] + smooth * inv, scaled).float()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + turned.float() * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: PeerConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.wqkv = nn.Linear(
            cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False
        )
        self.wo = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(self, x, cos, sin, mask, pos) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        q = rotate(q.view(b, t, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = rotate(k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        group = self.heads // self.kv_heads
        keys = self.k_cache.repeat_interleave(group, dim=1)
        values = self.v_cache.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: PeerConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: PeerConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin, mask, pos) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, pos)
        return h + self.feed_forward(self.ffn_norm(h))


class PeerLlama(nn.Module):
    def __init__(self, cfg: PeerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def setup_caches(self, batch: int, max_seq: int) -> None:
        """Static buffers: the KV cache, the causal mask and the rotary tables, on the weights' device."""
        w = self.tok_embeddings.weight
        for layer in self.layers:
            shape = (batch, self.cfg.num_kv_heads, max_seq, self.cfg.head_dim)
            layer.attention.k_cache = torch.zeros(shape, dtype=w.dtype, device=w.device)
            layer.attention.v_cache = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self.causal = torch.ones(max_seq, max_seq, dtype=torch.bool, device=w.device).tril()
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_frequencies(self.cfg)).to(
            w.device
        )
        self.cos = torch.cat((angles, angles), dim=-1).cos()
        self.sin = torch.cat((angles, angles), dim=-1).sin()

    def forward(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits of the tokens `idx` (batch, t) at positions `pos` (t,)."""
        mask = self.causal[None, None, pos]
        cos, sin = self.cos[pos], self.sin[pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, pos)
        return self.output(self.norm(x)).float()

    def load_hf(self, state: dict[str, torch.Tensor]) -> None:
        """Weights from a transformers LlamaForCausalLM state dict (projections fused here)."""
        own = {
            "tok_embeddings.weight": state["model.embed_tokens.weight"],
            "norm.weight": state["model.norm.weight"],
        }
        own["output.weight"] = state.get("lm_head.weight", state["model.embed_tokens.weight"])
        for i in range(self.cfg.num_layers):
            p = f"model.layers.{i}."
            a = [state[f"{p}self_attn.{n}_proj.weight"] for n in "qkv"]
            own |= {
                f"layers.{i}.attention.wqkv.weight": torch.cat(a),
                f"layers.{i}.attention.wo.weight": state[f"{p}self_attn.o_proj.weight"],
                f"layers.{i}.feed_forward.w13.weight": torch.cat(
                    [state[f"{p}mlp.gate_proj.weight"], state[f"{p}mlp.up_proj.weight"]]
                ),
                f"layers.{i}.feed_forward.w2.weight": state[f"{p}mlp.down_proj.weight"],
                f"layers.{i}.attention_norm.weight": state[f"{p}input_layernorm.weight"],
                f"layers.{i}.ffn_norm.weight": state[f"{p}post_attention_layernorm.weight"],
            }
        self.load_state_dict(own, strict=True)


def decode_one(model: PeerLlama, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One greedy decode step: the function gpt-fast compiles."""
    return model(token, pos)[:, -1].argmax(dim=-1, keepdim=True)


def compiled_step(compile: bool) -> Callable[[PeerLlama, torch.Tensor, torch.Tensor], torch.Tensor]:
    if not compile:
        return decode_one
    import torch._inductor.config as inductor

    inductor.coordinate_descent_tuning = True
    inductor.triton.unique_kernel_names = True
    return torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)


def greedy(model: PeerLlama, prompts: torch.Tensor, steps: int, step_fn=decode_one) -> torch.Tensor:
    """Prefill eagerly, then `steps` decode steps; the generated ids, (batch, steps)."""
    t = prompts.shape[1]
    with torch.no_grad():
        token = model(prompts, torch.arange(t, device=prompts.device))[:, -1].argmax(dim=-1, keepdim=True)
        out = [token]
        # The position stays on the device and steps in place, as in gpt-fast: a new tensor a step
        # would copy from pageable memory and wait for the GPU, costing the peer its overlap.
        pos = torch.tensor([t], device=prompts.device)
        for _ in range(steps - 1):
            token = step_fn(model, token.clone(), pos).clone()
            pos += 1
            out.append(token)
    return torch.cat(out, dim=1)


def step_time(
    hf_config: dict[str, Any], batch: int, prompt_len: int, short: int, long: int, repeats: int = 3
) -> float:
    """Steady-state seconds per compiled decode step, random bf16 weights built on the GPU: the median
    over `repeats` of a long run less a short one, as bench/decode.py times fastpath's rows."""
    cfg = PeerConfig.from_hf(hf_config)
    with torch.device("cuda"):
        model = PeerLlama(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.setup_caches(batch, prompt_len + long + 8)
    step = compiled_step(True)
    prompts = torch.randint(1000, cfg.vocab_size, (batch, prompt_len), device="cuda")

    def run(n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        greedy(model, prompts, n, step)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(3):  # compile, tune and capture before anything is timed
        run(short)
    return statistics.median((run(long) - run(short)) / (long - short) for _ in range(repeats))
