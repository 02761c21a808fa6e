#!/usr/bin/env python3
"""One all-reduce inside a CUDA graph, NCCL beside fastpath's symmetric-memory path, on 2+ GPUs.

    python bench/allreduce.py --out bench/results [--world 2]

Each rank captures a graph of REPEATS back-to-back all-reduces of one message size, replays it, and
times the replays with CUDA events; the figure is the time per all-reduce. The fast path is the
engine's own (`TPContext.setup_allreduce`, model/symm_allreduce.py): one-shot up to 512 KiB,
two-shot above, the copy into symmetric memory included. NVLink multicast stays off.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, replay_seconds, write_outputs

SIZES_KIB = [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192]
REPEATS, REPLAYS = 20, 20


def graph_time(fn, x: torch.Tensor) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEATS):
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    return replay_seconds(graph, REPLAYS) * 1e6 / REPEATS


def rank_main(rank: int, world: int, port: int, out: str) -> None:
    from fastpath.runtime.model.collectives import TPContext
    from fastpath.runtime.parallel.launcher import keep_multicast_off

    keep_multicast_off()
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.new_group(backend="nccl")
    device = torch.device("cuda", rank)
    dtype = torch.bfloat16
    tp = TPContext(rank, world, group)
    path = tp.setup_allreduce("auto", device, dtype, max(SIZES_KIB) << 10)
    nccl = TPContext(rank, world, group)
    rows = []
    for kib in SIZES_KIB:
        x = torch.randn((kib << 10) // 2, device=device, dtype=dtype)
        row = {"bytes": kib << 10, "nccl_us": graph_time(nccl.all_reduce, x)}
        row["fast_us"] = graph_time(tp.all_reduce, x) if tp.fast is not None else None
        rows.append(row)
        dist.barrier(group)
    if rank == 0:
        Path(out).write_text(json.dumps({"world": world, "path": path, "rows": rows}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    if torch.cuda.device_count() < args.world:
        print(f"bench/allreduce.py needs {args.world} CUDA devices; {torch.cuda.device_count()} are visible")
        return
    scratch = args.out / "allreduce.rank0.json"
    args.out.mkdir(parents=True, exist_ok=True)
    port = 29500 + os.getpid() % 1000
    mp.spawn(rank_main, args=(args.world, port, str(scratch)), nprocs=args.world, join=True)
    result = json.loads(scratch.read_text())
    scratch.unlink()
    body = []
    for r in result["rows"]:
        fast = r["fast_us"]
        body.append([
            f"{r['bytes'] >> 10} KiB", f"{r['nccl_us']:.1f}", "-" if fast is None else f"{fast:.1f}",
            "-" if fast is None else f"{r['nccl_us'] / fast:.1f}x",
        ])  # fmt: skip
    text = markdown_table(["message", "NCCL µs", "fastpath µs", "speed-up"], body)
    text += f"\n\n{result['world']} ranks, bf16, in a CUDA graph; fastpath's path: {result['path']}."
    write_outputs(args.out, "allreduce", {"env": environment(), **result}, text)
    print(text)


if __name__ == "__main__":
    main()
