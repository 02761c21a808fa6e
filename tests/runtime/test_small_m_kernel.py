"""The small-M linear kernel compiled for the H200 without a GPU: every config at every row tile."""

import importlib.util
import subprocess

import pytest

POINTERS = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_small_m_kernel_compiles_for_the_h200_at_every_config(block_m, tmp_path):
    """What the interpreter lets through (a tile shape the tensor cores cannot take, an atomic's
    semantics) fails here, ahead of device time."""
    from triton import compile as compile_kernel
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from fastpath.runtime.kernels import triton_kernels as K

    kernel = K.gemm_small_m_kernel
    for i, config in enumerate(K.small_m_configs(block_m)):
        consts = dict(config.kwargs, BLOCK_M=block_m, HAS_BIAS=False, USE_PDL=False)
        signature = {n: "constexpr" if n in consts else POINTERS.get(n, "i32") for n in kernel.arg_names}
        source = ASTSource(kernel, signature, constexprs=consts)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        compiled = compile_kernel(source, target=GPUTarget("cuda", 90, 32), options=options)
        ptx = tmp_path / f"small_m_{block_m}_{i}.ptx"
        ptx.write_text(compiled.asm["ptx"])
        if config.kwargs["SPLIT_K"] > 1:
            assert "atom" in compiled.asm["ptx"], "split-K counts its programs with an atomic"
        cmd = [get_ptxas(90).path, "--gpu-name=sm_90a", str(ptx), "-o", str(ptx.with_suffix(".cubin"))]
        subprocess.run(cmd, capture_output=True, text=True, check=True)
