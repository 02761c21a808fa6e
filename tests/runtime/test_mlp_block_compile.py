"""mlp_block.cu built for the H100/H200 (sm_90) on the CPU with nvcc, where the CUDA toolkit is: every build
the engine or the bench launches compiles without spilling, fits shared memory, and stays small enough for
the instruction cache (round 30: a 165 KB build ran it dry)."""

import shutil
import subprocess

import pytest
import torch

from fastpath.runtime.kernels import mlp_block

NVCC = shutil.which("nvcc")
BUILDS = sorted(
    {mlp_block.variant_for(m, s) for m in (1, 8, 9, 16) for s in (None, 2, 3, 4)}
    | {mlp_block.variant_for(8, stamps=True), mlp_block.variant_for(8, warps=16)},
    key=repr,
)


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("variant", [v for v in BUILDS if v.fits_shared()], ids=repr)
def test_builds_without_spills_and_small(variant, tmp_path):
    out = tmp_path / "mlp_block.cubin"
    cmd = [NVCC, "-arch=sm_90", "-cubin", "-std=c++17", "-Xptxas", "-v", "-o", str(out), *variant.options()]
    done = subprocess.run([*cmd, str(mlp_block.SOURCE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0 bytes spill stores" in done.stderr, done.stderr
    assert out.stat().st_size < 64 * 1024


def test_the_default_builds_fit_shared_memory_and_the_deepest_rings_do_not():
    for m in (1, 8, 9, 16):
        assert mlp_block.variant_for(m).fits_shared(), m
    assert mlp_block.variant_for(8).stages == 4 and mlp_block.variant_for(16).stages == 3
    assert not mlp_block.variant_for(16, 4).fits_shared()


def test_fits_refuses_what_the_kernel_does_not_take():
    def layer(m=8, q=2048, h=2048, i=8192, dtype=torch.bfloat16):
        t = lambda *s: torch.empty(*s, dtype=dtype)  # noqa: E731
        return t(m, q), t(m, h), t(h, q), None, t(h), t(2 * i, h), t(h, i)

    # Tensors on the CPU: never (the kernel is CUDA's); the shape checks come after, and are tested on
    # the GPU (test_gpu_mlp_block.py).
    assert not mlp_block.fits(*layer())
    attn, residual, wo, _, norm, wgu, wd = layer()
    assert not mlp_block.fits(attn, residual, wo, torch.empty(2048, dtype=torch.bfloat16), norm, wgu, wd)
