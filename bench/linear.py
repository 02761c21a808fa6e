#!/usr/bin/env python3
"""The decode step's linears on their own: each of the 1.24B Llama's weight shapes at M rows, streamed
from HBM as in a step (one weight per layer, more than L2 holds), in a CUDA graph replayed back to back.

Side by side, per (M, linear): cuBLAS (`F.linear`), fastpath's `TritonOps.linear` as the engine runs
it, every config of the small-M Triton kernel at M's row tile, and the tensor-core GEMV (mma_gemv.cu)
at each warps x chunks-in-flight build, its ring filled per lane and by whole lines (mma_gemv.LINES), so
the engine's pick can be checked against the best. gate_up
is also timed with its SiLU-mul: cuBLAS then the silu_mul kernel, against the gated tensor-core GEMV.
Bandwidth is the weight's bytes over the time, against device copy bandwidth.

    python bench/linear.py --out DIR [--m 1 8 16 32 64 128] [--layers 16]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth, environment, markdown_table, replay_seconds, write_outputs

# (warps a block, chunks a slot, slots): the engine's (8, 2, 4) and (16, 2, 4), gated (8, 1, 4), and around
MMA_BUILDS = [
    (8, 2, 4), (8, 1, 4), (8, 2, 2), (8, 1, 8), (4, 2, 4), (16, 2, 4), (16, 1, 4), (16, 2, 2),
    (8, 2, 8), (8, 4, 2), (8, 4, 4),
]  # fmt: skip


def shapes(config) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear a decode step runs, fused as the engine fuses them."""
    h, dim = config.hidden_size, config.head_dim
    qkv = (config.num_heads + 2 * config.num_kv_heads) * dim
    return {
        "qkv": (qkv, h),
        "o": (h, config.num_heads * dim),
        "gate_up": (2 * config.intermediate_size, h),
        "down": (h, config.intermediate_size),
        "lm_head": (config.vocab_size, h),
    }


def time_linears(fn, xs: torch.Tensor, weights: list[torch.Tensor], replays: int) -> float:
    """Seconds per linear: `fn(x, w)` for every weight in turn, captured once, replayed."""
    for w in weights:  # warm-up: compiles and autotunes outside the capture
        fn(xs, w)
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for w in weights:
            fn(xs, w)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph.replay()
    return replay_seconds(graph, replays) / len(weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--name", default="linear")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128])
    ap.add_argument("--layers", type=int, default=16, help="distinct weights per shape (the model's layers)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--linears", nargs="+", default=None, help="a subset of qkv o gate_up down lm_head")
    ap.add_argument(
        "--pdl", action="store_true", help="each small-M config also with programmatic dependent launch"
    )
    ap.add_argument("--no-small-m", action="store_true", help="leave out the small-M Triton kernel's configs")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/linear.py needs a CUDA device")
        return
    from fastpath.runtime.kernels import mma_gemv, triton_ops
    from fastpath.runtime.kernels import triton_kernels as K
    from fastpath.runtime.model.presets import PRESETS

    config = PRESETS["llama-1b"]
    ops = triton_ops.TritonOps()
    bw = copy_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, table = [], []
    for name, (n, k) in shapes(config).items():
        if args.linears and name not in args.linears:
            continue
        copies = 2 if name == "lm_head" else args.layers  # one lm_head is already 10x L2
        weights = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
            for _ in range(copies)
        ]
        for m in args.m:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            impls = {"cuBLAS": lambda x, w: F.linear(x, w), "fastpath": ops.linear}
            if 2 <= m <= max(K.SMALL_M_BLOCKS) and not args.no_small_m:
                block_m = next(b for b in K.SMALL_M_BLOCKS if m <= b)
                for cfg in K.small_m_configs(block_m, k):
                    label = "{BLOCK_N}x{BLOCK_K} split {SPLIT_K} w{num_warps} s{num_stages}".format(**cfg)
                    for pdl in (False, True) if args.pdl else (False,):
                        impls[label + (" pdl" if pdl else "")] = lambda x, w, cfg=cfg, pdl=pdl: ops.small_m(
                            x, w, None, cfg, pdl
                        )
            if 2 <= m <= mma_gemv.MAX_ROWS and mma_gemv.available(0)[0]:
                for (warps, unroll, stages), lines in itertools.product(MMA_BUILDS, (False, True)):
                    for pdl in (False, True) if args.pdl else (False,):
                        label = f"mma{' lines' if lines else ''} w{warps} u{unroll} s{stages}" + (
                            " pdl" if pdl else ""
                        )
                        build = dict(warps=warps, unroll=unroll, stages=stages, pdl=pdl, lines=lines)
                        impls[label] = lambda x, w, b=build: mma_gemv.linear(x, w, **b)
                        if name == "gate_up":
                            impls[label.replace("mma", "mma gated")] = lambda x, w, b=build: mma_gemv.linear(
                                x, w, gated=True, **b
                            )
                if name == "gate_up":
                    impls["cuBLAS + silu_mul"] = lambda x, w: ops.silu_mul(F.linear(x, w))
                    impls["fastpath gated"] = ops.gated_linear
            for impl, fn in impls.items():
                try:
                    seconds = time_linears(fn, x, weights, args.replays)
                except Exception as exc:  # one config that fails to compile must not end the run
                    print(f"{name} m={m} {impl}: {type(exc).__name__}: {exc}"[:300])
                    continue
                rate = n * k * 2 / seconds
                rows.append(
                    {
                        "linear": name,
                        "n": n,
                        "k": k,
                        "m": m,
                        "impl": impl,
                        "us": seconds * 1e6,
                        "bytes_per_s": rate,
                    }
                )
                table.append(
                    [
                        m,
                        name,
                        f"{n}x{k}",
                        impl,
                        f"{seconds * 1e6:.1f}",
                        f"{rate / 1e12:.2f}",
                        f"{rate / bw:.0%}",
                    ]
                )
            print(
                f"{name} m={m}: "
                + ", ".join(f"{r['impl']} {r['us']:.1f}" for r in rows if r["m"] == m and r["linear"] == name)
            )
        del weights
        torch.cuda.empty_cache()
    summary = step_summary(rows, config.num_layers)
    md = markdown_table(["M", "linear", "N x K", "impl", "µs", "TB/s", "of copy bw"], table)
    md = (
        f"Copy bandwidth {bw / 1e12:.2f} TB/s.\n\nThe step's linears ({config.num_layers} layers and the LM head), "
        "µs per step:\n\n"
        + markdown_table(
            ["M", "cuBLAS", "fastpath", "best config each", "best tensor-core GEMV build each"], summary
        )
        + "\n\n"
        + md
    )
    write_outputs(
        args.out, args.name, {"env": environment(), "copy_bandwidth_bytes_per_s": bw, "rows": rows}, md
    )


def _plain(times: dict[str, float]) -> dict[str, float]:
    """The impls without the SiLU-mul: gate_up's gated rows are compared with each other, not here."""
    return {k: v for k, v in times.items() if "gated" not in k and "silu" not in k}


def step_summary(rows: list[dict], layers: int) -> list[list[object]]:
    """Per M, the step's linears summed: each layer's four and the LM head once."""
    out = []
    for m in sorted({r["m"] for r in rows}):
        here = [r for r in rows if r["m"] == m]
        times = {}
        for r in here:
            times.setdefault(r["linear"], {})[r["impl"]] = r["us"]
        count = {name: 1 if name == "lm_head" else layers for name in times}

        def total(pick, times=times, count=count):
            vals = [pick(t) for t in times.values()]
            return None if None in vals else sum(v * count[name] for v, name in zip(vals, times, strict=True))

        cells = [
            total(lambda t: t.get("cuBLAS")),
            total(lambda t: t.get("fastpath")),
            total(lambda t: min(_plain(t).values())),
            total(lambda t: min((v for k, v in _plain(t).items() if k.startswith("mma")), default=None)),
        ]
        out.append([m, *(f"{c:.0f}" if c is not None else "—" for c in cells)])
    return out


if __name__ == "__main__":
    main()
