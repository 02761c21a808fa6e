"""Plain-PyTorch ops, rounding where HF transformers rounds, so bf16 runs agree with it bit for bit on CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .guided_mask import guided_mask_reference
from .sampling import rank_counts_reference, sample_reference


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class TorchOps:
    name = "torch"

    def describe(self, device: torch.device) -> str:
        """The per-token kernels in words, for the engine's log."""
        return "plain torch ops"

    def add_rms_norm(self, x, residual, weight, eps):
        """(norm(x + residual), x + residual); residual None means x is the first layer's input."""
        summed = x if residual is None else x + residual
        return rms_norm(summed, weight, eps), summed

    def rms_norm(self, x, weight, eps):
        return rms_norm(x, weight, eps)

    def linear(self, x, weight, bias=None):
        return F.linear(x, weight, bias)

    def add_rms_norm_linear(self, x, residual, norm_weight, eps, weight, bias=None):
        """(linear(norm(x + residual)), x + residual): a layer's norm and the projection after it."""
        normed, summed = self.add_rms_norm(x, residual, norm_weight, eps)
        return self.linear(normed, weight, bias), summed

    def add_rms_norm_gated_linear(self, x, residual, norm_weight, eps, weight):
        """(silu(gate) * up of linear(norm(x + residual)), x + residual): the MLP's norm and gate_up_proj,
        `weight` holding the gate's rows, then the up's."""
        normed, summed = self.add_rms_norm(x, residual, norm_weight, eps)
        return self.gated_linear(normed, weight), summed

    def gated_linear(self, x, weight):
        return self.silu_mul(self.linear(x, weight))

    def mlp_block(self, attn, residual, o_weight, o_bias, norm_weight, eps, gate_up_weight, down_weight):
        """(down_proj of silu(gate) * up of norm(o + residual), o + residual), o = o_proj(attn): a decoder
        layer's half after attention, on one GPU and without adapters."""
        o = self.linear(attn, o_weight, o_bias)
        act, summed = self.add_rms_norm_gated_linear(o, residual, norm_weight, eps, gate_up_weight)
        return self.linear(act, down_weight), summed

    def lora_add(self, x, out, a, b, slots, width):
        """`out` plus the LoRA deltas of rows `x` through the slots' A [K, C] and B [C, N] side by side,
        row i on slot `slots[i]` (-1: none), each slot `width` columns (model/lora_table.py); `out` is
        written in place and returned."""
        # A fill, not a product with a 0/1 mask: another slot's inf (an fp16 overflow) times 0 is NaN.
        other = torch.arange(a.shape[1], device=a.device)[None, :] // width != slots[:, None]
        return out.addmm_((x @ a).masked_fill_(other, 0), b)

    def greedy(self, logits):
        """(argmax tokens, their log-probabilities) of fp32-upcast logits."""
        logits = logits.float()
        tokens = logits.argmax(dim=-1)
        return tokens, logits.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)

    def sample(self, logits, params, entries, bits, num_top):
        """The general sampler (kernels/sampling.py): (tokens, logprobs, top_ids, top_logprobs, and
        how many logits beat each row's token: [B, 1], every row)."""
        tokens, logprobs, top_ids, top_lp = sample_reference(logits, params, entries, bits, num_top)
        return tokens, logprobs, top_ids, top_lp, rank_counts_reference(logits, tokens)

    # (logits with each constrained row's forbidden tokens at -inf, params with min_tokens lifted where a
    # grammar allows only stop tokens, or None): use the returned logits, the Triton op masks in place.
    guided_mask = staticmethod(guided_mask_reference)

    def silu_mul(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def qkv_linear_rope_cache(self, x, weight, bias, *args):
        """The q|k|v projection of x, then `qkv_rope_cache(qkv, *args)`: returns q."""
        return self.qkv_rope_cache(self.linear(x, weight, bias), *args)

    def qkv_rope_cache(self, qkv, positions, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, slots, shape):
        """Split q|k|v, apply per-head norms and RoPE, write k and v into the paged cache; return q."""
        heads, kv_heads, dim = shape
        q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        q = q.view(-1, heads, dim)
        k = k.view(-1, kv_heads, dim)
        v = v.view(-1, kv_heads, dim)
        if q_norm is not None:
            q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
        c = cos[positions].to(q.dtype)[:, None, :]
        s = sin[positions].to(q.dtype)[:, None, :]
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        k_cache.view(-1, kv_heads, dim).index_copy_(0, slots, k)
        v_cache.view(-1, kv_heads, dim).index_copy_(0, slots, v)
        return q
