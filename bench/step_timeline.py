#!/usr/bin/env python3
"""What the GPU does between two decode graphs: a steady decode run traced (CUDA activity only),
split into steps at the prologue's unpack kernel, each step's time between graphs broken down.

    python bench/step_timeline.py --out DIR [--batch 64 256] [--sampling greedy penalties]

bench/decode.py's "wall / replay" says how much longer a step takes than its graph replayed back to
back; this says where that time goes on the device: the copies in and out, the unpack launch, and
the idle gaps between them (where the stream waited for the host to enqueue the next operation).
"launch lead" is how long before the graph began the host called cudaGraphLaunch: small or
negative means the GPU waited on the host.

The same graph is then traced replayed back to back (as decode.py's replay column times it), so the
graph's span inside the engine loop and alone compare under the same tracing; the kernels whose
time differs most between the two are listed by name.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, markdown_table, write_outputs
from decode import decode_graph, phase_workload


@dataclass(frozen=True, slots=True)
class Op:
    start: float  # µs
    end: float
    kind: str  # unpack | h2d | d2h | memset | kernel
    name: str = ""


def kind_of(name: str) -> str:
    if "decode_unpack" in name:
        return "unpack"
    if "HtoD" in name:
        return "h2d"
    if "DtoH" in name:
        return "d2h"
    if "Memset" in name or "memset" in name:
        return "memset"
    return "kernel"


def steps_of(ops: list[Op], launches: list[float]) -> list[dict[str, float]]:
    """Per step (one unpack to the next): its period, its graph's span and kernels' busy time, and
    the time from the end of its graph's last kernel to the next graph's first, by what filled it."""
    ops = sorted(ops, key=lambda o: o.start)
    marks = [i for i, o in enumerate(ops) if o.kind == "unpack"]
    launches = sorted(launches)
    out = []
    for a, b in itertools.pairwise(marks):
        graph = [o for o in ops[a + 1 : b] if o.kind == "kernel"]
        if not graph:
            continue
        first, last = graph[0], graph[-1]
        nxt = next((o for o in ops[b + 1 :] if o.kind == "kernel"), None)
        if nxt is None:
            break
        between = [o for o in ops[a + 1 :] if last.end <= o.start and o.end <= nxt.start]
        busy: dict[str, float] = {}
        cursor, idle = last.end, 0.0
        for o in between:
            idle += max(0.0, o.start - cursor)
            busy[o.kind] = busy.get(o.kind, 0.0) + (o.end - max(o.start, cursor))
            cursor = max(cursor, o.end)
        idle += max(0.0, nxt.start - cursor)
        span, kernel_busy = span_and_busy(graph)
        before = [t for t in launches if t <= first.start]
        row = {
            "period": ops[b].start - ops[a].start,
            "graph_span": span,
            "graph_busy": kernel_busy,
            "kernels": float(len(graph)),
            "between": nxt.start - last.end,
            "between_idle": idle,
            "unpack_to_graph": first.start - ops[a].end,
        }
        for kind in ("h2d", "d2h", "unpack", "memset"):
            row[f"between_{kind}"] = busy.get(kind, 0.0)
        if before:
            row["launch_lead"] = first.start - before[-1]
        out.append(row)
    return out


def loop_graphs(ops: list[Op]) -> list[list[Op]]:
    """Each traced step's graph kernels in launch order (from one unpack kernel to the next)."""
    ops = sorted(ops, key=lambda o: o.start)
    marks = [i for i, o in enumerate(ops) if o.kind == "unpack"]
    return [[o for o in ops[a + 1 : b] if o.kind == "kernel"] for a, b in itertools.pairwise(marks)]


def replay_graphs(ops: list[Op], per_graph: int) -> list[list[Op]]:
    """Back-to-back replays' kernels cut into graphs of `per_graph` kernels each."""
    kernels = sorted((o for o in ops if o.kind == "kernel"), key=lambda o: o.start)
    return [kernels[i : i + per_graph] for i in range(0, len(kernels) - per_graph + 1, per_graph)]


def span_and_busy(graph: list[Op]) -> tuple[float, float]:
    busy, cursor = 0.0, graph[0].start
    for o in graph:
        busy += max(0.0, o.end - max(o.start, cursor))
        cursor = max(cursor, o.end)
    return graph[-1].end - graph[0].start, busy


def middle(graphs: list[list[Op]], size: int) -> list[list[Op]]:
    """The graphs of `size` kernels, the first and last quarter left out (ramp and tail)."""
    same = [g for g in graphs if len(g) == size]
    return same[len(same) // 4 : len(same) - len(same) // 4] or same


def kernel_deltas(loop: list[list[Op]], alone: list[Op], replays: int, top: int = 6) -> list[dict]:
    """Per kernel name, its time a step inside the engine loop (median over steps) and replayed alone
    (the replays' total over their count), µs, the names whose time grew most in the loop first.
    Summed by name, not matched launch by launch: the two traces need not list a graph's kernels in
    the same order. Under PDL a kernel's traced time includes its wait for the one before it."""

    def by_name(ops) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for o in ops:
            t = out.setdefault(o.name, [0.0, 0.0])
            t[0] += o.end - o.start
            t[1] += 1
        return out

    steps = [by_name(g) for g in loop]
    replayed = by_name(o for o in alone if o.kind == "kernel")
    rows = []
    for name in set().union(*steps) | set(replayed):
        in_loop = statistics.median(s.get(name, [0.0, 0.0])[0] for s in steps)
        launches = statistics.median(s.get(name, [0.0, 0.0])[1] for s in steps)
        solo = replayed.get(name, [0.0, 0.0])
        rows.append({"kernel": name, "launches": launches, "launches_alone": solo[1] / replays,
                     "loop_us": in_loop, "alone_us": solo[0] / replays, "grown_us": in_loop - solo[0] / replays})  # fmt: skip
    return sorted(rows, key=lambda r: -r["grown_us"])[:top]


def summary(steps: list[dict[str, float]]) -> dict[str, float]:
    """Medians over the middle half of the steps (the ramp at either end left out)."""
    if not steps:
        return {}
    typical = statistics.median(s["kernels"] for s in steps)
    steady = [s for s in steps if s["kernels"] == typical]
    mid = steady[len(steady) // 4 : len(steady) - len(steady) // 4] or steady
    keys = sorted(set().union(*(s.keys() for s in mid)))
    return {k: statistics.median(s[k] for s in mid if k in s) for k in keys} | {"steps": float(len(mid))}


def trace(fn) -> tuple[list[Op], list[float]]:
    """fn() traced, CUDA activity only: its device operations, and when the host launched graphs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ops, launches = [], []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            ops.append(Op(e.time_range.start, e.time_range.end, kind_of(e.name), e.name))
        elif e.name == "cudaGraphLaunch":
            launches.append(e.time_range.start)
    return ops, launches


REPLAYS = 40


def replays(llm, batch: int, kind: str, count: int):
    """A function replaying the decode graph the engine ran `batch` rows of `kind` in, back to back."""
    graph = decode_graph(llm, batch, kind)

    def run():
        with torch.cuda.stream(llm.executor.runner.execution_stream):
            for _ in range(count):
                graph.replay()

    return run


COLUMNS = [
    ("period", "µs/step"),
    ("graph_span", "graph span"),
    ("graph_busy", "kernels busy"),
    ("between", "between graphs"),
    ("between_d2h", "d2h"),
    ("between_h2d", "h2d"),
    ("between_unpack", "unpack"),
    ("between_idle", "idle"),
    ("unpack_to_graph", "unpack → graph"),
    ("launch_lead", "launch lead"),
    ("replay_span", "replay span"),
    ("replay_busy", "replay busy"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--model", default="random:llama-1b")
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--name", default="step_timeline", help="the output files' stem")
    ap.add_argument("--sampling", nargs="+", choices=["greedy", "penalties"], default=["greedy", "penalties"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/step_timeline.py needs a CUDA device")
        return
    os.environ.setdefault("FASTPATH_PROGRESS", "0")
    from fastpath.runtime import LLM

    rows, grown, payload = [], [], {"environment": environment(), "rows": []}
    for batch in args.batch:
        llm = LLM(args.model, device="cuda", max_batch_size=batch, max_seq_len=512)
        for kind in args.sampling:
            prompts, params = phase_workload(llm, batch, kind, args.tokens)
            llm.generate(prompts, params, use_tqdm=False)  # warm
            ops, launches = trace(functools.partial(llm.generate, prompts, params, use_tqdm=False))
            steps = steps_of(ops, launches)
            med = summary(steps)
            size = int(med.get("kernels", 0))
            loop = middle(loop_graphs(ops), size)
            graph_kind = "greedy" if kind == "greedy" else "general"
            alone_ops = trace(replays(llm, batch, graph_kind, REPLAYS))[0]
            alone = middle(replay_graphs(alone_ops, size), size)
            deltas = kernel_deltas(loop, alone_ops, REPLAYS) if loop and alone else []
            if alone:
                spans = [span_and_busy(g) for g in alone]
                med["replay_span"] = statistics.median(s for s, _ in spans)
                med["replay_busy"] = statistics.median(b for _, b in spans)
            payload["rows"].append(
                {"batch": batch, "sampling": kind, "median": med, "steps": steps, "kernels_grown": deltas}
            )
            rows.append(
                [kind, batch, f"{med.get('steps', 0):.0f}"]
                + [f"{med[k]:.1f}" if k in med else "-" for k, _ in COLUMNS]
            )
            grown.extend(
                [kind, batch, d["kernel"][:60], f"{d['launches']:g} / {d['launches_alone']:g}",
                 f"{d['loop_us']:.1f}", f"{d['alone_us']:.1f}", f"{d['grown_us']:+.1f}"]
                for d in deltas
            )  # fmt: skip
        del llm
        torch.cuda.empty_cache()
    table = markdown_table(["sampling", "batch", "steps"] + [h for _, h in COLUMNS], rows)
    table += (
        "\n\nMedians over the middle half of a traced run's steady decode steps, in µs. 'between graphs':"
        " from a graph's last kernel to the next graph's first, split into copies, the unpack kernel and"
        " idle stream time. 'replay span' and 'replay busy': the same graph replayed back to back under"
        " the same tracing."
    )
    table += "\n\n" + markdown_table(
        ["sampling", "batch", "kernel", "launches: loop / alone", "loop µs", "alone µs", "grown µs"], grown
    )
    table += (
        "\n\nPer kernel name, its time a step in the engine loop (median) and replayed alone (mean). Under"
        " PDL a kernel's traced time includes its wait for the kernel before it."
    )
    write_outputs(args.out, args.name, payload, table)


if __name__ == "__main__":
    main()
