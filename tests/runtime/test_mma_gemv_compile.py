"""mma_gemv.cu built for the H200 (sm_90) on the CPU with nvcc, where the CUDA toolkit is: every build the
engine launches compiles without spilling, and the weight's first loads come before the PDL wait."""

import dataclasses
import re
import shutil
import subprocess

import pytest

from fastpath.runtime.kernels import mma_gemv

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")

ENGINE_BUILDS = (
    {
        mma_gemv.variant_for(m, k, gated, bias and not gated)
        for m in (8, 16)
        for k in (2048, 8192)
        for gated in (False, True)
        for bias in (False, True)
    }
    # q|k|v with RoPE in the epilogue (triton_ops.MMA_ROPE): Llama's 64- and Qwen2's 128-wide heads.
    | {
        mma_gemv.variant_for(m, 2048, False, bias, rope_dim=d)
        for m in (8, 16)
        for bias in (False, True)
        for d in (64, 128)
    }
    # Rounds 22-30's rings: four slots of two chunks, gated four of one.
    | {
        mma_gemv.variant_for(m, 2048, gated, False, unroll=2 - gated, stages=4)
        for m in (8, 16)
        for gated in (0, 1)
    }
)
# Each with its ring filled whole lines a copy (the default) and per lane (FASTPATH_LINES=0).
BUILDS = sorted(
    {dataclasses.replace(v, lines=lines) for v in ENGINE_BUILDS for lines in (False, True)}, key=repr
)


def _nvcc(variant, out, kind: str) -> str:
    cmd = [NVCC, "-arch=sm_90", f"-{kind}", "-o", str(out), *variant.options(), str(mma_gemv.SOURCE)]
    done = subprocess.run([*cmd, "-Xptxas", "-v"] if kind == "cubin" else cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize("variant", BUILDS, ids=repr)
def test_every_engine_build_compiles_for_sm90_without_spills(variant, tmp_path):
    info = _nvcc(variant, tmp_path / "k.cubin", "cubin")
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    assert spills and all(s == ("0", "0") for s in spills), info


def test_the_ring_is_requested_before_the_wait_and_x_read_after(tmp_path):
    variant = mma_gemv.variant_for(8, 2048, False, False)
    _nvcc(variant, tmp_path / "k.ptx", "ptx")
    ptx = (tmp_path / "k.ptx").read_text()
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") < wait
    before = ptx[:wait]
    # Every slot of the ring: its chunks of the lane's two rows, 16 bytes each, one commit group a slot.
    pieces = variant.stages * variant.unroll * 2
    assert before.count("cp.async.cg.shared.global") == pieces
    assert before.count("cp.async.commit_group") == variant.stages
    # In the loop (unrolled over the slots, so the x ring's index is a constant), one slot refilled a group.
    assert ptx.count("cp.async.cg.shared.global") == 2 * pieces
    # x is written by the kernel before this one: no load of it may precede the wait, and none may take
    # the non-coherent path.
    assert "ld.global" not in before and "ld.global.cg.v4.u32" in ptx[wait:]
    assert "ld.global.nc" not in ptx
    assert (
        ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
        == 2 * variant.unroll * variant.stages
    )
    assert "ld.local" not in ptx and "st.local" not in ptx  # the x ring stays in registers


def test_the_rope_build_changes_only_the_rows_a_block_takes_and_its_epilogue(tmp_path):
    """The RoPE build streams as the plain one (same copies, same products); its epilogue reads the
    positions, slots and tables only after the wait, and writes bf16 to q and the caches."""
    plain, rope = (
        mma_gemv.variant_for(8, 2048, False, False),
        mma_gemv.variant_for(8, 2048, False, False, rope_dim=64),
    )
    _nvcc(plain, tmp_path / "plain.ptx", "ptx")
    _nvcc(rope, tmp_path / "rope.ptx", "ptx")
    a, b = (tmp_path / "plain.ptx").read_text(), (tmp_path / "rope.ptx").read_text()
    for op in ("cp.async.cg.shared.global", "cp.async.commit_group", "mma.sync.aligned.m16n8k16"):
        assert a.count(op) == b.count(op), op
    wait = b.index("griddepcontrol.wait")
    assert "ld.global" not in b[:wait]
    # x still never on the non-coherent path; the positions, slots (written before the step's chain
    # began) and the cos/sin tables may be.
    assert "ld.global.nc.v4" not in b and set(re.findall(r"ld\.global\.nc\.(\w+)", b)) <= {"f32", "u64"}
    assert "ld.local" not in b and "st.local" not in b
    # q's and k's two halves, v's two: six bf16 stores a decode row, none of them fp32.
    assert b.count("st.global.b16") + b.count("st.global.u16") >= 6


def test_a_rope_build_without_a_head_size_does_not_compile(tmp_path):
    out = tmp_path / "k.ptx"
    done = subprocess.run([NVCC, "-arch=sm_90", "-ptx", "-o", str(out), "-DROPE=1", str(mma_gemv.SOURCE)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "ROPE needs HEAD_DIM" in done.stderr


def test_the_lines_build_copies_as_many_pieces_and_syncs_the_warp_around_each_slot(tmp_path):
    """LINES moves which lane copies a piece, not how many: the same copies before the wait and in the loop,
    and a lane reads pieces other lanes copied only past a __syncwarp (two a group: before the reads and
    before the refill)."""
    plain = mma_gemv.variant_for(8, 2048, False, False, lines=False)
    lines = dataclasses.replace(plain, lines=True)
    ptx = {}
    for v in (plain, lines):
        _nvcc(v, tmp_path / "k.ptx", "ptx")
        ptx[v.lines] = (tmp_path / "k.ptx").read_text()
    for text in ptx.values():
        wait = text.index("griddepcontrol.wait")
        assert text[:wait].count("cp.async.cg.shared.global") == plain.stages * plain.unroll * 2
    assert ptx[True].count("cp.async.cg.shared.global") == ptx[False].count("cp.async.cg.shared.global")
    assert "bar.warp.sync" not in ptx[False]
    assert ptx[True].count("bar.warp.sync") == 2 * plain.stages  # the loop is unrolled over the slots


def test_a_lines_build_needs_a_power_of_two_chunks_a_slot(tmp_path):
    out = tmp_path / "k.ptx"
    done = subprocess.run([NVCC, "-arch=sm_90", "-ptx", "-o", str(out), "-DLINES=1", "-DUNROLL=3", str(mma_gemv.SOURCE)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "LINES needs UNROLL 1, 2, 4 or 8" in done.stderr
