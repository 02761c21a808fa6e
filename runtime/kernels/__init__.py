"""The model's per-token operations, in two interchangeable sets with the same numerics.

`TorchOps` is plain PyTorch in HF transformers' order of roundings. `TritonOps` fuses each
operation into one kernel on CUDA (residual add + RMSNorm, q/k norm + RoPE + KV-cache write,
SiLU-and-multiply, and a GEMV for decode-sized batches) while rounding at the same points.
"""

from .torch_ops import TorchOps

__all__ = ["TorchOps", "select_ops"]


def select_ops(device_type: str, fused: bool | None):
    """TritonOps on CUDA with Triton installed (unless fused=False); TorchOps otherwise."""
    import importlib.util

    want = fused if fused is not None else device_type == "cuda"
    if want and device_type == "cuda" and importlib.util.find_spec("triton") is not None:
        from .triton_ops import TritonOps

        return TritonOps()
    if fused and device_type != "cuda":
        raise ValueError("fused_kernels=True needs a CUDA device")
    return TorchOps()
