"""The decode kernels compiled for the H200 without a GPU: what the interpreter lets through fails here."""

import importlib.util
import subprocess

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]

POINTERS = dict(
    x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32"
)
ROPE_POINTERS = dict(
    POINTERS, pos_ptr="*i64", slot_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", q_ptr="*bf16",
    kc_ptr="*bf16", vc_ptr="*bf16", qkv_ptr="*bf16", qn_ptr="*bf16", kn_ptr="*bf16", q_out_ptr="*bf16",
    eps="fp32",
)  # fmt: skip
ATTENTION_POINTERS = dict(
    q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", tables_ptr="*i32", lens_ptr="*i32", acc_ptr="*fp32",
    ml_ptr="*fp32", out_ptr="*bf16", scale="fp32",
)  # fmt: skip
GUIDED_POINTERS = dict(
    logits_ptr="*bf16", mask_ptr="*i32", flags_ptr="*i32", params_ptr="*i64", entries_ptr="*i32",
    other_ptr="*i32", out_ptr="*i64",
)  # fmt: skip


def compile_for_h200(kernel, consts: dict, pointers: dict, ptx_path, options: dict | None = None) -> str:
    """Compile `kernel` for sm_90 with `consts` (other constexprs at their defaults, every other argument
    typed from `pointers`, else i32), assemble its PTX with ptxas (which fails the test on an error),
    and return the PTX."""
    from triton import compile as compile_kernel
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    # Constexprs left out take their defaults, as a launch that leaves them out does.
    consts = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default} | consts
    signature = {n: "constexpr" if n in consts else pointers.get(n, "i32") for n in kernel.arg_names}
    source = ASTSource(kernel, signature, constexprs=consts)
    ptx = compile_kernel(source, target=GPUTarget("cuda", 90, 32), options=options or {}).asm["ptx"]
    ptx_path.write_text(ptx)
    cmd = [get_ptxas(90).path, "--gpu-name=sm_90a", str(ptx_path), "-o", str(ptx_path.with_suffix(".cubin"))]
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    return ptx


def _tuned_launch(config) -> dict:
    return dict(num_warps=config.num_warps, num_stages=config.num_stages)


@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_small_m_kernel_compiles_for_the_h200_at_every_config(block_m, tmp_path):
    """What the interpreter lets through (a tile shape the tensor cores cannot take, an atomic's
    semantics) fails here, ahead of device time."""
    from fastpath.runtime.kernels import triton_kernels as K

    for i, config in enumerate(K.small_m_configs(block_m, 8192)):
        launch = {name: config.pop(name) for name in ("num_warps", "num_stages")}
        consts = dict(config, BLOCK_M=block_m, HAS_BIAS=False, USE_PDL=True)
        ptx = compile_for_h200(K.gemm_small_m_kernel, consts, POINTERS, tmp_path / f"small_m_{i}.ptx", launch)
        if config["SPLIT_K"] > 1:
            assert "atom" in ptx, "split-K counts its programs with an atomic"


@pytest.mark.parametrize("gated", [False, True])
def test_gemv_compiles_for_the_h200_at_every_config(gated, tmp_path):
    """The batch-1 GEMV, plain and with the SiLU-mul in its epilogue, at each config it is tuned over."""
    from fastpath.runtime.kernels import triton_kernels as K

    kernel = getattr(K.gemv_kernel, "fn", K.gemv_kernel)  # the autotuner's kernel
    for i, config in enumerate(K._gemv_configs()):
        consts = dict(config.kwargs, HAS_BIAS=False, USE_PDL=True, GATED=gated)
        compile_for_h200(kernel, consts, POINTERS, tmp_path / f"gemv_{i}.ptx", _tuned_launch(config))


@pytest.mark.parametrize("bias", [False, True])
def test_gemv_rope_cache_compiles_for_the_h200_at_every_config(bias, tmp_path):
    """The batch-1 q|k|v GEMV with RoPE and the KV-cache write in its epilogue, Llama 3.2 1B's heads
    (and Qwen2's bias), at each config it is tuned over."""
    from fastpath.runtime.kernels import triton_kernels as K

    kernel = getattr(K.gemv_rope_cache_kernel, "fn", K.gemv_rope_cache_kernel)
    for i, config in enumerate(K._gemv_configs()):
        consts = dict(config.kwargs, HEADS=32, KV_HEADS=8, DIM=64, HAS_BIAS=bias, USE_PDL=True)
        compile_for_h200(
            kernel, consts, ROPE_POINTERS, tmp_path / f"gemv_rope_{i}.ptx", _tuned_launch(config)
        )


@pytest.mark.parametrize("qk_norm", [False, True])
def test_qkv_rope_cache_compiles_for_the_h200(qk_norm, tmp_path):
    """RoPE and the KV-cache write for the rows the GEMV does not take, with Qwen3's per-head norms
    and without."""
    from fastpath.runtime.kernels import triton_kernels as K

    consts = dict(HEADS=32, KV_HEADS=8, HEADS_PAD=32, KV_PAD=8, DIM=64, HAS_NORM=qk_norm, USE_PDL=True)
    compile_for_h200(K.qkv_rope_cache_kernel, consts, ROPE_POINTERS, tmp_path / "rope.ptx")


@pytest.mark.parametrize("splits", [1, 8])
@pytest.mark.parametrize("window", [0, 4096])
def test_decode_attention_compiles_for_the_h200_with_one_split_and_with_several(splits, window, tmp_path):
    """The decode attention's split kernel writes its output itself with one split, or its partials
    for the reduce kernel with several, with and without a window: each compiles for sm_90, with its
    first chunk's loads ahead of the wait."""
    from fastpath.runtime.attention.triton_decode import _load_kernels

    consts = dict(
        GROUP=4, GROUP_PAD=16, HEAD_DIM=64, BLOCK=16, CHUNK=64, NUM_SPLITS=splits, WINDOW=window, USE_PDL=True
    )
    ptx = compile_for_h200(_load_kernels()[0], consts, ATTENTION_POINTERS, tmp_path / "split.ptx")
    # Earlier steps' keys and values are read before the wait for q|k|v, so they overlap it.
    before_wait = ptx[: ptx.index("griddepcontrol.wait")]
    # A 64x64 bf16 tile is at least four 16-byte loads a thread; the length and table add one or two.
    assert before_wait.count("ld.global") >= 8, "the first chunk's K and V loads moved past the wait"


@pytest.mark.parametrize("has_params", [False, True])
def test_guided_mask_kernels_compile_for_the_h200(has_params, tmp_path):
    """The bitmask kernel for greedy and for the general sampler's rows, and the min_tokens lift."""
    from fastpath.runtime.kernels import guided_mask_triton as G

    cases = [(G.guided_mask_kernel, dict(SLOTS_COL=9, HAS_PARAMS=has_params, BLOCK=G.BLOCK))]
    if has_params:
        consts = dict(FIELDS=12, MIN_TOKENS_COL=10, FIELDS_POW2=16, BLOCKS_POW2=32)
        cases.append((G.lift_min_tokens_kernel, consts))
    for i, (kernel, consts) in enumerate(cases):
        compile_for_h200(kernel, consts, GUIDED_POINTERS, tmp_path / f"guided_{i}.ptx")
