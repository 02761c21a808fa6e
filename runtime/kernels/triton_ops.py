"""TritonOps: each per-token operation of the model as one fused kernel on CUDA."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import triton_kernels as K
from .torch_ops import TorchOps

GEMV_MAX_M = 16  # decode-sized batches stream the weights once; larger ones are real GEMMs for cuBLAS


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


class TritonOps(TorchOps):
    name = "triton"

    def add_rms_norm(self, x, residual, weight, eps):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty_like(x)
        summed = x if residual is None else torch.empty_like(x)
        res = x if residual is None else residual
        K.add_rms_norm_kernel[(rows,)](
            x, res, weight, out, summed, x.stride(0), res.stride(0), out.stride(0), summed.stride(0), cols, eps,
            HAS_RES=residual is not None, BLOCK=_pow2(cols), num_warps=8 if cols >= 4096 else 4,
        )  # fmt: skip
        return out, summed

    def rms_norm(self, x, weight, eps):
        return self.add_rms_norm(x, None, weight, eps)[0]

    def linear(self, x, weight, bias=None):
        m = x.shape[0]
        # fp32 stays on cuBLAS: the GEMV accumulates in fp32 too, but parity tests want cuBLAS's exact path.
        if m > GEMV_MAX_M or x.dtype == torch.float32 or x.dim() != 2:
            return F.linear(x, weight, bias)
        x = x.contiguous()
        n, k = weight.shape
        y = torch.empty(m, n, device=x.device, dtype=x.dtype)
        b = bias if bias is not None else weight
        grid = lambda meta: (triton_cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        if m == 1:
            K.gemv_kernel[grid](
                x,
                weight,
                b,
                y,
                n,
                k,
                weight.stride(0),
                HAS_BIAS=bias is not None,
                **K.untuned_args(K._gemv_configs()),
            )
        else:
            K.gemm_small_m_kernel[grid](
                x, weight, b, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0), HAS_BIAS=bias is not None,
                **K.untuned_args(K._small_m_configs()),
            )  # fmt: skip
        return y

    def silu_mul(self, gate_up):
        rows, cols2 = gate_up.shape
        cols = cols2 // 2
        out = torch.empty(rows, cols, device=gate_up.device, dtype=gate_up.dtype)
        block = 1024
        K.silu_mul_kernel[(rows, triton_cdiv(cols, block))](
            gate_up, out, cols, gate_up.stride(0), out.stride(0), BLOCK=block
        )
        return out

    def qkv_rope_cache(self, qkv, positions, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, slots, shape):
        heads, kv_heads, dim = shape
        tokens = qkv.shape[0]
        qkv = qkv.contiguous()
        q = torch.empty(tokens, heads, dim, device=qkv.device, dtype=qkv.dtype)
        K.qkv_rope_cache_kernel[(tokens,)](
            qkv, positions, cos, sin, q_norm if q_norm is not None else cos, k_norm if k_norm is not None else cos,
            k_cache, v_cache, slots, q, qkv.stride(0), cos.stride(0), eps,
            HEADS=heads, KV_HEADS=kv_heads, HEADS_PAD=_pow2(heads), KV_PAD=_pow2(kv_heads), DIM=dim,
            HAS_NORM=q_norm is not None,
        )  # fmt: skip
        return q


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
