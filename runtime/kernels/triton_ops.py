"""TritonOps: each per-token operation of the model as one fused kernel on CUDA."""

from __future__ import annotations

import dataclasses
import functools
import os

import torch
import torch.nn.functional as F

from . import lora_kernels, mlp_block, mma_gemv
from . import triton_kernels as K
from .guided_mask_triton import guided_mask
from .torch_ops import TorchOps

# One decode row's q|k|v GEMV with RoPE and the KV-cache write in its epilogue; bench/ab_step.py turns it
# off to time the two launches beside it.
FUSE_QKV_ROPE = True
# The batch-1 GEMVs' config (BLOCK_N, BLOCK_K, num_warps, num_stages): two rows of 2048 columns a
# program, under programmatic dependent launch the whole tile read before the wait. The autotuner times
# each kernel alone with L2 flushed, and for the gated gate_up and the RoPE GEMV it picked shapes that
# ran the batch-1 step 26 µs slower in the graph's chain (round 20, bench/ab_step.py). One config with
# PDL on or off, so PDL changes no bit. None: the autotuner picks.
GEMV_CONFIG: tuple[int, int, int, int] | None = (2, 2048, 4, 2)
# The batch-1 RoPE GEMV reads the position, slot and cos/sin ahead of its wait (round 21); False reads
# them after it, for bench/ab_step.py to compare.
EARLY_ROPE = True
GEMV_MAX_M = 16  # past 16 rows cuBLAS streams the weights faster than gemm_small_m (bench/linear.py)
# 2-16 rows on the tensor-core GEMV (mma_gemv.cu) where it builds; False keeps round 21's small-M
# Triton kernel and cuBLAS, for bench/ab_step.py to compare.
MMA_SMALL_M = True
# 2-16 rows' q|k|v with RoPE and the KV-cache write in the tensor-core GEMV's epilogue, one launch where
# there are two. Off unless FASTPATH_MMA_ROPE=1: written in round 23 without a GPU (compiled with nvcc,
# not yet run); the GPU tests and bench/ab_step.py's "PDL, q|k|v RoPE in the tensor-core GEMV" variant
# turn it on to check and time it.
MMA_ROPE = os.environ.get("FASTPATH_MMA_ROPE") == "1"
# 1-16 rows' o_proj, MLP norm, gate_up_proj, SiLU-mul and down_proj as one persistent launch
# (mlp_block.cu). Off unless FASTPATH_MLP_BLOCK=1 until bench/ab_step.py has timed it on a GPU.
MLP_BLOCK = os.environ.get("FASTPATH_MLP_BLOCK") == "1"
# LoRA's deltas as the shrink and expand kernels (lora_kernels.py); False keeps round 27's three torch
# ops, for bench/lora.py to compare.
LORA_KERNELS = True


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@functools.cache
def pdl_available(device_index: int) -> tuple[bool, str]:
    """Whether kernels here can launch with programmatic dependent launch, and why (for the engine's info)."""
    if K.INTERPRET:
        return False, "the Triton interpreter"
    # On by default since round 11: the one capture failure with it on (round 9) did not come back
    # once captures ran with the cyclic collector paused (graphs.no_collection); see performance.md.
    if os.environ.get("FASTPATH_PDL", "1") == "0":
        return False, "off: FASTPATH_PDL=0"
    if torch.cuda.get_device_capability(device_index)[0] < 9:
        return False, "needs compute capability 9.0 (Hopper) or newer"
    try:
        import triton.language as tl
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False, "Triton has no CUDA backend"
    fields = {f.name for f in dataclasses.fields(CUDAOptions)}
    if "launch_pdl" not in fields or not hasattr(tl.extra.cuda, "gdc_wait"):
        return False, "this Triton has no programmatic dependent launch"
    return True, "on"


def pdl_args(x: torch.Tensor) -> dict:
    """Launch arguments for programmatic dependent launch on x's device, when it has it: for a kernel
    with a USE_PDL parameter that waits (gdc_wait) before it reads anything an earlier kernel writes."""
    if x.device.type != "cuda" or not pdl_available(x.device.index or 0)[0]:
        return {}
    return {"USE_PDL": True, "launch_pdl": True}


class TritonOps(TorchOps):
    name = "triton"

    def __init__(self) -> None:
        self._counts: dict[tuple, torch.Tensor] = {}

    def describe(self, device: torch.device) -> str:
        on, why = pdl_available(device.index or 0) if device.type == "cuda" else (False, "not CUDA")
        mma, mma_why = mma_gemv.available(device.index or 0) if device.type == "cuda" else (False, "not CUDA")
        if not MMA_SMALL_M:
            mma, mma_why = False, "triton_ops.MMA_SMALL_M is False"
        rope = "; q|k|v RoPE in its epilogue" if mma and MMA_ROPE else ""
        block = ""
        if MLP_BLOCK:
            ok, block_why = (
                mlp_block.available(device.index or 0) if device.type == "cuda" else (False, "not CUDA")
            )
            block = f"; 1-16 rows' MLP half in one persistent launch {'on' if ok else 'off: ' + block_why}"
        return (
            f"fused Triton kernels; programmatic dependent launch {'on' if on else 'off: ' + why}; "
            f"2-16 rows on the tensor-core GEMV {'on' if mma else 'off: ' + mma_why}{rope}{block}"
        )

    def _pdl(self, x: torch.Tensor) -> dict:
        return pdl_args(x)

    def add_rms_norm(self, x, residual, weight, eps):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty_like(x)
        summed = x if residual is None else torch.empty_like(x)
        res = x if residual is None else residual
        K.add_rms_norm_kernel[(rows,)](
            x, res, weight, out, summed, x.stride(0), res.stride(0), out.stride(0), summed.stride(0), cols, eps,
            HAS_RES=residual is not None, BLOCK=_pow2(cols), num_warps=8 if cols >= 4096 else 4, **self._pdl(x),
        )  # fmt: skip
        return out, summed

    def rms_norm(self, x, weight, eps):
        return self.add_rms_norm(x, None, weight, eps)[0]

    def linear(self, x, weight, bias=None):
        if not self._streams(x):
            return F.linear(x, weight, bias)
        if x.shape[0] == 1:
            return self._gemv(x, weight, bias)
        if self._mma(x, weight, bias):
            return mma_gemv.linear(x, weight, bias, pdl=bool(self._pdl(x)))
        config = K.small_m_config(x.shape[0], *weight.shape)
        if config is None:
            return F.linear(x, weight, bias)
        config = dict(config)
        return self.small_m(x, weight, bias, config=config, pdl=config.pop("pdl"))

    def small_m(self, x, weight, bias, config: dict, pdl: bool = False):
        """x @ weight^T for 2 <= M <= 64 rows in one pass over the weight, launched with `config`
        (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) and, if `pdl`, programmatic dependent launch."""
        x = x.contiguous()
        m, (n, k) = x.shape[0], weight.shape
        block_m = next(b for b in K.SMALL_M_BLOCKS if m <= b)
        y = torch.empty(m, n, device=x.device, dtype=x.dtype)
        split = config["SPLIT_K"]
        parts = torch.empty(split * m * n if split > 1 else 1, device=x.device, dtype=torch.float32)
        grid = (triton_cdiv(n, config["BLOCK_N"]), split)
        K.gemm_small_m_kernel[grid](
            x, weight, bias if bias is not None else weight, y, parts, self._arrivals(weight, n), m, n, k,
            x.stride(0), weight.stride(0), y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=block_m, **config,
            **(self._pdl(x) if pdl else {}),
        )  # fmt: skip
        return y

    def _arrivals(self, weight, n: int) -> torch.Tensor:
        """Split-K's per-tile arrival counts for this weight: zero between launches (the last program of a
        tile resets its count), so one buffer per weight serves every launch and graph replay."""
        key = (weight.data_ptr(), weight.device)
        counts = self._counts.get(key)
        if counts is None or counts.numel() < triton_cdiv(n, 16):
            counts = self._counts[key] = torch.zeros(
                triton_cdiv(n, 16), device=weight.device, dtype=torch.int32
            )
        return counts

    def lora_add(self, x, out, a, b, slots, width):
        # Two launches in the PDL chain where the three torch ops took three outside it (lora_kernels.py).
        on = LORA_KERNELS and (x.device.type == "cuda" or K.INTERPRET)
        if not on or not lora_kernels.fits(x, a) or any(t.stride(1) != 1 for t in (out, a, b)):
            return super().lora_add(x, out, a, b, slots, width)
        key = ("lora", a.data_ptr(), a.device)
        counts = self._counts.get(key)
        if counts is None:
            rows = triton_cdiv(lora_kernels.MAX_ROWS, lora_kernels.BLOCK_M)
            counts = self._counts[key] = torch.zeros(rows, device=a.device, dtype=torch.int32)
        return lora_kernels.lora_add(x, out, a, b, slots, width, counts, self._pdl(x))

    def mlp_block(self, attn, residual, o_weight, o_bias, norm_weight, eps, gate_up_weight, down_weight):
        # One launch for five where it builds (mlp_block.cu).
        if (
            MLP_BLOCK
            and mlp_block.fits(attn, residual, o_weight, o_bias, norm_weight, gate_up_weight, down_weight)
            and mlp_block.available(attn.device.index or 0)[0]
        ):
            key = ("mlp_block", down_weight.data_ptr(), attn.device)
            arrivals = self._counts.get(key)
            if arrivals is None:
                arrivals = self._counts[key] = torch.zeros(1, device=attn.device, dtype=torch.int64)
            return mlp_block.mlp_block(
                attn, residual, o_weight, norm_weight, eps, gate_up_weight, down_weight, arrivals,
                pdl=bool(self._pdl(attn)),
            )  # fmt: skip
        return super().mlp_block(
            attn, residual, o_weight, o_bias, norm_weight, eps, gate_up_weight, down_weight
        )

    guided_mask = staticmethod(guided_mask)

    def greedy(self, logits):
        rows, vocab = logits.shape
        block = 4096
        parts = _pow2(triton_cdiv(vocab, block))
        part_max = torch.empty(rows, parts, device=logits.device, dtype=torch.float32)
        part_idx = torch.empty(rows, parts, device=logits.device, dtype=torch.int32)
        part_sum = torch.empty(rows, parts, device=logits.device, dtype=torch.float32)
        # Parts past the vocabulary read only -inf: their max is -inf and they never win.
        K.argmax_lse_partial_kernel[(rows, parts)](
            logits,
            logits.stride(0),
            vocab,
            part_max,
            part_idx,
            part_sum,
            BLOCK=block,
            PARTS=parts,
            **self._pdl(logits),
        )
        tokens = torch.empty(rows, device=logits.device, dtype=torch.int64)
        logprobs = torch.empty(rows, device=logits.device, dtype=torch.float32)
        K.argmax_lse_final_kernel[(rows,)](
            part_max, part_idx, part_sum, tokens, logprobs, vocab, PARTS=parts, **self._pdl(logits)
        )
        return tokens, logprobs

    def sample(self, logits, params, entries, bits, num_top):
        """The general sampler as fused kernels, no sort of the vocabulary (sampling_triton.py), then
        per-part counts of the logits above each token in rows that asked for logprobs
        (sampling_rank.py): most rows' counts come from the sampler's list of top raw logits."""
        from .sampling_rank import rank_counts
        from .sampling_triton import sample

        known = torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)
        tokens, logprobs, top_ids, top_lp = sample(logits, params, entries, bits, num_top, listed_ranks=known)
        return tokens, logprobs, top_ids, top_lp, rank_counts(logits, params, tokens, top_ids, known=known)

    @staticmethod
    def _streams(x) -> bool:
        # fp32 stays on cuBLAS: the parity tests compare it with HF's exact fp32 path.
        return x.dim() == 2 and x.shape[0] <= GEMV_MAX_M and x.dtype != torch.float32

    def gated_linear(self, x, weight):
        # One row: the SiLU-mul in the GEMV's epilogue, one launch and no [1, 2I] round trip.
        if self._streams(x) and x.shape[0] == 1 and weight.shape[0] % 2 == 0:
            return self._gemv(x, weight, None, gated=True)
        if weight.shape[0] % 2 == 0 and self._mma(x, weight, None, gated=True):
            return mma_gemv.linear(x, weight, gated=True, pdl=bool(self._pdl(x)))
        return super().gated_linear(x, weight)

    @staticmethod
    def _mma(x, weight, bias, gated: bool = False) -> bool:
        """Whether 2-16 rows go to the tensor-core GEMV: on, fitting, and built on this device."""
        return (
            MMA_SMALL_M
            and x.dim() == 2
            and mma_gemv.fits(x, weight, bias, gated)
            and mma_gemv.available(x.device.index or 0)[0]
        )

    def _gemv(self, x, weight, bias, gated: bool = False):
        x = x.contiguous()
        n, k = weight.shape
        n = n // 2 if gated else n
        y = torch.empty(1, n, device=x.device, dtype=x.dtype)
        kernel, config = _gemv_launch(K.gemv_kernel)
        kernel[_grid(n)](
            x, weight, bias if bias is not None else weight, y, n, k, weight.stride(0),
            HAS_BIAS=bias is not None, GATED=gated, **config, **self._pdl(x),
        )  # fmt: skip
        return y

    def silu_mul(self, gate_up):
        rows, cols2 = gate_up.shape
        cols = cols2 // 2
        out = torch.empty(rows, cols, device=gate_up.device, dtype=gate_up.dtype)
        block = 1024
        K.silu_mul_kernel[(rows, triton_cdiv(cols, block))](
            gate_up, out, cols, gate_up.stride(0), out.stride(0), BLOCK=block, **self._pdl(gate_up)
        )
        return out

    def qkv_linear_rope_cache(self, x, weight, bias, *args):
        # k_norm and eps go unused: the fused path runs only for models without per-head norms.
        positions, cos, sin, q_norm, _, _, k_cache, v_cache, slots, shape = args
        heads, kv_heads, dim = shape
        if (
            MMA_ROPE
            and q_norm is None
            and self._mma(x, weight, bias)
            and mma_gemv.fits_rope(x, weight, bias, positions, slots, cos, sin, k_cache, v_cache, shape)
        ):
            pdl = bool(self._pdl(x))
            return mma_gemv.linear_rope_cache(
                x, weight, bias, positions, slots, cos, sin, k_cache, v_cache, shape, pdl=pdl
            )
        fused = (
            FUSE_QKV_ROPE
            and self._streams(x)
            and x.shape[0] == 1
            and q_norm is None  # a per-head norm needs the whole head: the two launches do it
            and dim % 2 == 0
            and weight.shape[0] == (heads + 2 * kv_heads) * dim
            and k_cache.is_contiguous()
            and v_cache.is_contiguous()
        )
        if not fused:
            return super().qkv_linear_rope_cache(x, weight, bias, *args)
        x = x.contiguous()
        n, k = weight.shape
        q = torch.empty(1, heads, dim, device=x.device, dtype=x.dtype)
        kernel, config = _gemv_launch(K.gemv_rope_cache_kernel)
        kernel[_grid(n // 2)](
            x, weight, bias if bias is not None else weight, positions, slots, cos, sin, q, k_cache, v_cache,
            n, k, weight.stride(0), cos.stride(0), HEADS=heads, KV_HEADS=kv_heads, DIM=dim,
            HAS_BIAS=bias is not None, EARLY_ROPE=EARLY_ROPE, **config, **self._pdl(x),
        )  # fmt: skip
        return q

    def qkv_rope_cache(self, qkv, positions, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, slots, shape):
        heads, kv_heads, dim = shape
        tokens = qkv.shape[0]
        qkv = qkv.contiguous()
        q = torch.empty(tokens, heads, dim, device=qkv.device, dtype=qkv.dtype)
        K.qkv_rope_cache_kernel[(tokens,)](
            qkv, positions, cos, sin, q_norm if q_norm is not None else cos, k_norm if k_norm is not None else cos,
            k_cache, v_cache, slots, q, qkv.stride(0), cos.stride(0), eps,
            HEADS=heads, KV_HEADS=kv_heads, HEADS_PAD=_pow2(heads), KV_PAD=_pow2(kv_heads), DIM=dim,
            HAS_NORM=q_norm is not None, **self._pdl(qkv),
        )  # fmt: skip
        return q


def _gemv_launch(kernel):
    """(kernel, launch arguments) of a batch-1 GEMV: GEMV_CONFIG's, the autotuner's, or the interpreter's."""
    if K.INTERPRET:
        return kernel, K.untuned_args(K._gemv_configs())
    if GEMV_CONFIG is None:
        return kernel, {}
    bn, bk, warps, stages = GEMV_CONFIG
    return kernel.fn, dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _grid(n: int):
    return lambda meta: (triton_cdiv(n, meta["BLOCK_N"]),)
