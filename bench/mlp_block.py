#!/usr/bin/env python3
"""The half of a decoder layer after attention alone, side by side in one run: the five ops the engine
launches (o_proj, the add and norm with gate_up_proj and the SiLU-mul, down_proj) against mlp_block.cu's
one persistent launch at each ring depth, each captured 16 times in a CUDA graph (a step's layers) and
replayed; then one stamped launch (the default slots) of the kernel, each block's clock at its phases' edges.

    python bench/mlp_block.py --out DIR [--rows 1 8 16] [--stages 2 3 4]   (rings past shared memory skipped)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, replay_seconds, write_outputs

Q, H, INTER, LAYERS = 2048, 2048, 8192, 16  # the 1.24B Llama
# The stamped build's 7 clocks a block (mlp_block.cu's STAMP points).
EDGES = ["start", "waited", "barrier 1 in", "barrier 1 out", "barrier 2 in", "barrier 2 out", "end"]


def graph_of(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/mlp_block.py needs a CUDA device")
        return
    from fastpath.runtime.kernels import mlp_block, triton_ops

    triton_ops.MLP_BLOCK = False
    ops = triton_ops.TritonOps()
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) * scale

    # A weight set a layer, so every launch streams from HBM as in a step.
    layers = [
        (
            rand(H, Q, scale=Q**-0.5),
            1 + 0.1 * rand(H),
            rand(2 * INTER, H, scale=H**-0.5),
            rand(H, INTER, scale=INTER**-0.5),
        )
        for _ in range(LAYERS)
    ]
    counters = [torch.zeros(1, device="cuda", dtype=torch.int64) for _ in range(LAYERS)]
    rows, table, payload = [], [], {"env": environment(), "rows": []}
    pdl = bool(ops._pdl(layers[0][0]))  # as the five ops launch (FASTPATH_PDL)
    for m in args.rows:
        attn, residual = rand(m, Q), rand(m, H)

        def five(attn=attn, residual=residual):
            for wo, norm, wgu, wd in layers:
                ops.mlp_block(attn, residual, wo, None, norm, 1e-5, wgu, wd)

        variants = {"five ops": five}
        for stages, lines in itertools.product(args.stages, (False, True)):
            if not mlp_block.variant_for(m, stages).fits_shared():
                continue

            def one(stages=stages, lines=lines, attn=attn, residual=residual):
                for (wo, norm, wgu, wd), counter in zip(layers, counters, strict=True):
                    mlp_block.mlp_block(
                        attn, residual, wo, norm, 1e-5, wgu, wd, counter, pdl=pdl, stages=stages, lines=lines
                    )

            variants[f"one launch, {stages} slots" + (", whole lines" if lines else "")] = one
        # 16 warps of 2 slots: the same bytes in flight an SM as 8 of 4, twice the warps issuing
        for lines in (False, True) if m <= 8 else ():

            def wide(attn=attn, residual=residual, lines=lines):
                for (wo, norm, wgu, wd), counter in zip(layers, counters, strict=True):
                    mlp_block.mlp_block(
                        attn, residual, wo, norm, 1e-5, wgu, wd, counter, pdl=pdl, warps=16, lines=lines
                    )

            variants["one launch, 16 warps, 2 slots" + (", whole lines" if lines else "")] = wide
        if m <= 8:
            # The 16-warp build splits K otherwise: close to the 8-warp one, not equal.
            wo, norm, wgu, wd = layers[0]
            eight = mlp_block.mlp_block(attn, residual, wo, norm, 1e-5, wgu, wd, counters[0])[0].float()
            sixteen = mlp_block.mlp_block(attn, residual, wo, norm, 1e-5, wgu, wd, counters[0], warps=16)[
                0
            ].float()
            gap = float((sixteen - eight).norm() / eight.norm())
            payload["rows"].append({"rows": m, "sixteen_warps_relative_gap": gap})
            print(f"rows {m}: 16 warps against 8, relative gap {gap:.2e}", flush=True)
        times = {name: [] for name in variants}
        graphs = {name: graph_of(fn) for name, fn in variants.items()}
        for _ in range(3):  # alternating
            for name, graph in graphs.items():
                times[name].append(replay_seconds(graph, 20) / LAYERS)
        base = statistics.median(times["five ops"])
        for name, ts in times.items():
            t = statistics.median(ts)
            row = {"rows": m, "variant": name, "layer_s": t, "runs_s": ts}
            payload["rows"].append(row)
            table.append(
                [
                    m,
                    name,
                    f"{t * 1e6:.1f}",
                    f"{(H * Q + 3 * INTER * H) * 2 / t / 1e12:.2f}",
                    f"{t / base:.2f}",
                ]
            )
            print(table[-1], flush=True)
        # One stamped launch each way of filling the ring: where a block's time goes.
        for lines in (False, True):
            stamps = torch.zeros(mlp_block.sms(0), 7, device="cuda", dtype=torch.int64)
            wo, norm, wgu, wd = layers[0]
            for _ in range(3):
                mlp_block.mlp_block(
                    attn, residual, wo, norm, 1e-5, wgu, wd, counters[0], stamps=stamps, lines=lines
                )
            torch.cuda.synchronize()
            s = stamps.double().cpu()
            s -= s[:, 0].min()
            summary = {
                e: (float(s[:, k].min() / 1e3), float(s[:, k].median() / 1e3), float(s[:, k].max() / 1e3))
                for k, e in enumerate(EDGES)
            }
            payload["rows"].append({"rows": m, "lines": lines, "stamps_us": summary})
            ring = "whole lines" if lines else "per lane"
            rows.append([m, ring] + [f"{lo:.1f} / {mid:.1f} / {hi:.1f}" for lo, mid, hi in summary.values()])
            print(rows[-1], flush=True)
    text = markdown_table(["rows", "variant", "µs a layer", "TB/s", "vs five ops"], table)
    text += "\n\nOne launch at its default slots, each block's clock (µs from the first block's start: min / median / max):\n\n"
    text += markdown_table(["rows", "ring", *EDGES], rows)
    write_outputs(args.out, "mlp_block", payload, text)


if __name__ == "__main__":
    main()
