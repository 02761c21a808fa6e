"""The fused general sampler checked on the CPU through Triton's interpreter, against its torch definition."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_fused_sampler_equals_its_definition_under_the_interpreter():
    script = Path(__file__).with_name("sampling_interpreter_checks.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and result.stdout.count("ok ") >= 15


POINTERS = dict(
    logits_ptr="*bf16", p_ptr="*i64", ent_ptr="*i32", bits_ptr="*i32", stat_ptr="*fp32", sidx_ptr="*i32",
    floor_ptr="*fp32", gmax_ptr="*fp32", lfill_ptr="*i32",
    hist_ptr="*i32", rhist_ptr="*i32", zpart_ptr="*i64", sel_ptr="*i32", fill_ptr="*i32",
    rnext_ptr="*i32", cand_ptr="*fp32", cidx_ptr="*i32", rcand_ptr="*fp32", ridx_ptr="*i32", below_ptr="*fp32",
    span_ptr="*i64", tok_ptr="*i64", lp_ptr="*fp32", top_ids_ptr="*i64", top_lp_ptr="*fp32", dec_ptr="*i32",
    after_ptr="*i64", count_ptr="*i32", mass_ptr="*i64", best_ptr="*fp32", idx_ptr="*i32", big_p_ptr="*fp64",
    rank_ptr="*i32",
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("top", [0, 20])
def test_fused_sampler_compiles_for_the_h200_and_its_passes_do_not_spill(top, tmp_path):
    """Ahead-of-time compilation for sm_90 needs no GPU: it catches what the interpreter lets through."""
    from triton import compile as compile_kernel
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from fastpath.runtime.kernels import sampling_triton as S

    pmax = 32  # a 128k vocabulary in 4096-logit chunks
    shapes = dict(
        CHUNK=S.CHUNK, BLOCK=S.BLOCK, PMAX=pmax, NB=S.BUCKETS, CAP=S.CANDIDATES, RCAP=S.RAW_CANDIDATES,
        LCAP=S.LISTED, RLCAP=S.RAW_LISTED,
    )  # fmt: skip
    groups = S.bound_groups(pmax, S.BLOCK)
    consts = {**shapes, "TOPK": top, "NPIV": S.PIVOTS, "CHECK": bool(top), "GROUPS": groups}
    consts["RANK_LIST"] = True
    kernels = (
        S.stats_kernel,
        S.floor_kernel,
        S.list_kernel,
        S.hist_kernel,
        S.select_kernel,
        S.gather_kernel,
        S.draw_kernel,
        S.decide_kernel,
    )
    for kernel in (*kernels, S.final_kernel):
        mine = {name: consts[name] for name in kernel.arg_names if name in consts}
        if kernel is S.decide_kernel:
            mine["CAP"] = S.LISTED  # its candidate list: a row's list, or a cut's candidates in it
        signature = {
            name: "constexpr" if name in mine else POINTERS.get(name, "i32") for name in kernel.arg_names
        }
        source = ASTSource(kernel, signature, constexprs=mine)
        warps = S.FINAL_WARPS if kernel in (S.decide_kernel, S.final_kernel) else S.PASS_WARPS
        options = {"enable_fp_fusion": False, "num_warps": warps}
        compiled = compile_kernel(source, target=GPUTarget("cuda", 90, 32), options=options)
        ptx = tmp_path / f"{kernel.__name__}.ptx"
        ptx.write_text(compiled.asm["ptx"])
        cmd = [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(ptx.with_suffix(".cubin"))]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        # The passes run a program per 4096 logits: their loops must keep everything in registers (a
        # value spilled once around a loop costs nothing). The per-row kernels may spill around the
        # slow path's calls.
        if kernel in (S.stats_kernel, S.list_kernel, S.hist_kernel, S.gather_kernel, S.draw_kernel):
            spills = _spills_in_loops(ptx.with_suffix(".cubin"))
            assert not spills, f"{kernel.__name__} spills registers in a loop: {spills}\n{log}"


def _spills_in_loops(cubin: Path) -> list[str]:
    """The local-memory loads and stores between a backward branch's target and the branch."""
    from triton import knobs

    sass = subprocess.run(
        [knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)
    code = [(int(at, 16), text) for at, text in lines]
    loops = []
    for at, text in code:
        jump = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)\s*$", text)
        if jump and int(jump.group(1), 16) < at:
            loops.append((int(jump.group(1), 16), at))
    assert loops, "no loop found: the SASS format changed"
    return [
        text for at, text in code if re.search(r"\b(STL|LDL)\b", text) and any(a <= at <= b for a, b in loops)
    ]
