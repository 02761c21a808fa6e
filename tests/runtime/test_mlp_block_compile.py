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
    | {mlp_block.variant_for(8, stamps=True), mlp_block.variant_for(8, warps=16)}
    | {
        mlp_block.variant_for(m, warps=w, lines=lines)
        for m in (8, 16)
        for w in (8, 16)
        for lines in (False, True)
    },
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
    """Checked on CPU tensors: the shape rules come before the device's, which alone refuses here."""

    def layer(m=8, q=2048, h=2048, i=8192, dtype=torch.bfloat16):
        t = lambda *s: torch.empty(*s, dtype=dtype)  # noqa: E731
        return [t(m, q), t(m, h), t(h, q), None, t(h), t(2 * i, h), t(h, i)]

    def refused_for_a_rule(args) -> bool:
        # With is_cuda the last condition, a CPU layer that passes every other rule reaches it: patch the
        # device check away to see which rule refused.
        class Cuda(torch.Tensor):
            is_cuda = True

        cuda_args = [a.as_subclass(Cuda) if isinstance(a, torch.Tensor) else a for a in args]
        return not mlp_block.fits(*cuda_args)

    assert not mlp_block.fits(*layer())  # a CPU tensor: the kernel is CUDA's
    assert (
        not refused_for_a_rule(layer())
        and not refused_for_a_rule(layer(m=1))
        and not refused_for_a_rule(layer(m=16))
    )
    assert not refused_for_a_rule(layer(q=4096, h=4096, i=14336))  # the 8B Llama
    assert refused_for_a_rule(layer(m=17))
    assert refused_for_a_rule(layer(q=1536))  # a warp's share of K would not be whole groups
    assert refused_for_a_rule(layer(i=8000))
    assert refused_for_a_rule(layer(dtype=torch.float16))
    with_bias = layer()
    with_bias[3] = torch.empty(2048, dtype=torch.bfloat16)
    assert refused_for_a_rule(with_bias)  # o_proj's bias: not in the kernel
    strided = layer()
    strided[0] = torch.empty(8, 4096, dtype=torch.bfloat16)[:, ::2]
    assert refused_for_a_rule(strided)
    mismatched = layer()
    mismatched[1] = torch.empty(8, 1024, dtype=torch.bfloat16)
    assert refused_for_a_rule(mismatched)
