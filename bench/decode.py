#!/usr/bin/env python3
"""Decode throughput on a GPU, side by side in one run: the native engine's variants, HF transformers
`generate`, a gpt-fast-style torch.compile peer of the same shape (bench/compile_peer.py), and the
weight-read floor (weight bytes over the copy bandwidth measured in this run).

    python bench/decode.py --out bench/results [--quick] [--batch 1 8 64] [--tp 2] [--sampling greedy]

Steady-state decode time per step is the difference between two generations that differ only in
length, so prefill, warmup and start-up cancel out. Each native row runs greedy and "sampled with
penalties" (SAMPLED: temperature, top-p, top-k, min-p, the three penalties and top-5 logprobs, every
request with its own seed): the general sampler inside the same decode graphs. `--tp 2` adds
tensor-parallel rows (2 GPUs, NCCL all-reduces inside the decode graphs) beside the one-GPU rows; a
tensor-parallel row's floor is its rank's weight bytes over the copy bandwidth, since every GPU
streams its shard at once.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth, environment, markdown_table, replay_seconds, wall, write_outputs

from fastpath.runtime.model.presets import resolve_random

MODEL = "random:llama-1b"
PEER = "torch.compile + CUDA graph (gpt-fast style, bench/compile_peer.py)"
PROMPT_LEN = 32
SAMPLED = dict(
    temperature=0.8, top_p=0.95, top_k=50, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
    frequency_penalty=0.5, logprobs=5,
)  # fmt: skip


def weight_bytes(llm) -> int:
    seen, total = set(), 0
    for p in llm.executor.model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def engine_step_time(llm, batch: int, short: int, long: int, repeats: int, sampled: bool = False) -> float:
    from fastpath.runtime import SamplingParams

    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(1000, 100000, (PROMPT_LEN,), generator=g).tolist() for _ in range(batch)]
    extra = SAMPLED if sampled else {"temperature": 0.0}

    def run(n):
        params = [SamplingParams(max_tokens=n, ignore_eos=True, seed=i, **extra) for i in range(batch)]
        return wall(lambda: llm.generate(prompts, params))

    run(short)  # first use of this batch size: nothing lazy left in the timed runs
    diffs = [(run(long) - run(short)) / (long - short) for _ in range(repeats)]
    return statistics.median(diffs)


def replay_time(llm, batch: int, kind: str, replays: int = 50) -> float | None:
    """The step's graph replayed back to back, host work left out: what the GPU alone takes."""
    graphs = llm.executor.runner.graphs
    rows = graphs.bucket(batch) if graphs is not None else None
    if rows is None or (rows, kind) not in graphs.graphs:
        return None
    graph = graphs.graphs[(rows, kind)].graph
    stream = llm.executor.runner.execution_stream
    with torch.cuda.stream(stream):
        for _ in range(3):
            graph.replay()
        return replay_seconds(graph, replays)


def hf_step_time(model: str, batch: int, short: int, long: int) -> float:
    import transformers

    from fastpath.runtime.model.presets import resolve_random

    cfg = transformers.LlamaConfig(
        **{k: v for k, v in resolve_random(model).to_hf_dict().items() if k != "architectures"}
    )
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(1000, 100000, (batch, PROMPT_LEN), device="cuda")

    def run(n):
        return wall(
            lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        )

    run(short)
    return (run(long) - run(short)) / (long - short)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument(
        "--model", default=MODEL, help="a random: preset (random:llama-8b for tensor parallelism)"
    )
    ap.add_argument("--name", default="decode", help="the output files' stem")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-compile-peer", action="store_true", help="skip the torch.compile peer rows")
    ap.add_argument("--variants", nargs="+", default=["fused", "torch-ops"], help="native variants to run")
    ap.add_argument("--package", action="append", default=[], help="generated package to run beside native")
    ap.add_argument("--tp", type=int, nargs="*", default=[], help="tensor-parallel sizes to run beside tp=1")
    ap.add_argument(
        "--sampling", nargs="+", choices=["greedy", "penalties"], default=["greedy", "penalties"],
        help="native rows: greedy, and sampled with penalties (SAMPLED)",
    )  # fmt: skip
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/decode.py needs a CUDA device; none is visible")
        return
    from fastpath.runtime import LLM

    short, long, repeats = (8, 40, 1) if args.quick else (16, 144, 3)
    bw = copy_bandwidth()
    results = {"env": environment(), "copy_bandwidth_bytes_per_s": bw, "rows": []}
    max_batch = max(args.batch)
    engines = {
        "fused": dict(fused_kernels=True),
        "torch-ops": dict(fused_kernels=False),
        "no-graphs": dict(cuda_graphs=False),
    }
    floor_bytes = None
    sizes = [1, *sorted({t for t in args.tp if t > 1})]
    for variant in args.variants:
        for tp in sizes:
            if tp > torch.cuda.device_count():
                print(f"skipping tp={tp}: {torch.cuda.device_count()} CUDA devices are visible", flush=True)
                continue
            llm = LLM(
                args.model,
                device="cuda",
                dtype="bfloat16",
                max_batch_size=max_batch,
                max_seq_len=512,
                tp=tp,
                **engines[variant],
            )
            rank_bytes = weight_bytes(llm)
            if tp == 1:
                floor_bytes = floor_bytes or rank_bytes
            name = f"native ({variant})" if tp == 1 else f"native ({variant}, tp={tp})"
            for b in args.batch:
                for sampling in args.sampling:
                    step = engine_step_time(llm, b, short, long, repeats, sampled=sampling == "penalties")
                    label = name if sampling == "greedy" else f"{name}, sampled with penalties"
                    row = {"engine": label, "batch": b, "step_s": step, "tp": tp, "variant": variant}
                    row |= {"sampling": sampling, "floor_step_s": rank_bytes / bw}
                    row["replay_s"] = replay_time(llm, b, "greedy" if sampling == "greedy" else "general")
                    row["allreduce"] = llm.parallel.tp.allreduce_path if llm.parallel is not None else None
                    results["rows"].append(row)
                    print(f"{label} batch {b}: {step * 1e6:.0f} us/step, {b / step:.0f} tok/s", flush=True)
            llm.close()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    for pkg in args.package:
        module = __import__(pkg)
        llm = module.LLM(
            model=MODEL, device="cuda", dtype="bfloat16", max_batch_size=max_batch, max_seq_len=512
        )
        for b in args.batch:
            step = engine_step_time(llm, b, short, long, repeats)
            results["rows"].append({"engine": f"generated {pkg}", "batch": b, "step_s": step})
            print(f"generated {pkg} batch {b}: {step * 1e6:.0f} us/step", flush=True)
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    if not args.no_compile_peer:
        from compile_peer import step_time as peer_step_time

        hf_dict = resolve_random(args.model).to_hf_dict()
        for b in args.batch:
            step = peer_step_time(hf_dict, b, PROMPT_LEN, short, long)
            gc.collect()
            torch.cuda.empty_cache()
            results["rows"].append({"engine": PEER, "batch": b, "step_s": step})
            print(f"torch.compile peer batch {b}: {step * 1e6:.0f} us/step", flush=True)
    if not args.no_hf:
        for b in args.batch:
            step = hf_step_time(args.model, b, 4 if args.quick else 8, 16 if args.quick else 40)
            gc.collect()
            torch.cuda.empty_cache()
            results["rows"].append({"engine": "HF transformers generate (eager)", "batch": b, "step_s": step})
            print(f"hf batch {b}: {step * 1e6:.0f} us/step", flush=True)
    if floor_bytes is None:  # only tensor-parallel rows ran: the one-GPU floor from the parameter count
        floor_bytes = resolve_random(args.model).num_parameters() * 2
    floor_step = floor_bytes / bw
    results["weight_bytes"] = floor_bytes
    results["floor_step_s"] = floor_step
    hf = {r["batch"]: r["step_s"] for r in results["rows"] if r["engine"].startswith("HF")}
    peer = {r["batch"]: r["step_s"] for r in results["rows"] if r["engine"] == PEER}
    one_gpu = {
        (r["variant"], r["batch"]): r["step_s"]
        for r in results["rows"]
        if r.get("tp") == 1 and r.get("sampling") == "greedy"
    }
    greedy = {
        (r["variant"], r["tp"], r["batch"]): r["step_s"]
        for r in results["rows"]
        if r.get("sampling") == "greedy"
    }
    rows = []
    for r in results["rows"]:
        b, step = r["batch"], r["step_s"]
        r["tok_s"] = b / step
        r["share_of_floor"] = r.get("floor_step_s", floor_step) / step
        r["speedup_vs_hf"] = hf[b] / step if b in hf else None
        r["speedup_vs_compile"] = peer[b] / step if b in peer and r["engine"] != PEER else None
        base = one_gpu.get((r.get("variant"), b)) if r.get("tp", 1) > 1 else None
        r["speedup_vs_tp1"] = base / step if base else None
        plain = greedy.get((r.get("variant"), r.get("tp"), b)) if r.get("sampling") == "penalties" else None
        r["vs_greedy"] = step / plain - 1 if plain else None
        replay = r.get("replay_s")
        rows.append([r["engine"], b, f"{r['tok_s']:.0f}", f"{step * 1e6:.0f}", f"{100 * r['share_of_floor']:.0f}%",
                     f"{r['speedup_vs_hf']:.1f}x" if r["speedup_vs_hf"] else "-",
                     f"{r['speedup_vs_compile']:.2f}x" if r["speedup_vs_compile"] else "-",
                     f"{r['speedup_vs_tp1']:.2f}x" if r["speedup_vs_tp1"] else "-",
                     f"{100 * r['vs_greedy']:+.1f}%" if r["vs_greedy"] is not None else "-",
                     f"{replay * 1e6:.0f}" if replay else "-", f"{step / replay:.2f}" if replay else "-"])  # fmt: skip
    for b in args.batch:
        rows.append(
            [
                "weight-read floor",
                b,
                f"{b / floor_step:.0f}",
                f"{floor_step * 1e6:.0f}",
                "100%",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
            ]
        )
    headers = ["engine", "batch", "tok/s", "µs/step", "share of floor", "vs HF", "vs torch.compile", "vs tp=1", "vs greedy",
               "replay µs", "wall / replay"]  # fmt: skip
    table = markdown_table(headers, rows)
    table += f"\n\nCopy bandwidth {bw / 1e12:.2f} TB/s; weights {floor_bytes / 1e9:.2f} GB; {results['env']}"
    paths = sorted({r["allreduce"] for r in results["rows"] if r.get("allreduce")})
    table += "".join(f"\n\nTensor-parallel all-reduce: {p}." for p in paths)
    results["model"] = args.model
    table += f"\n\nModel {args.model}."
    write_outputs(args.out, args.name, results, table)
    plot(results, args.out / f"{args.name}.png")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = sorted({r["engine"] for r in results["rows"]})
    batches = sorted({r["batch"] for r in results["rows"]})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / (len(engines) + 1)
    for i, engine in enumerate(engines):
        vals = [
            next((r["tok_s"] for r in results["rows"] if r["engine"] == engine and r["batch"] == b), 0)
            for b in batches
        ]
        ax.bar([x + i * width for x in range(len(batches))], vals, width, label=engine)
    floor = [b / results["floor_step_s"] for b in batches]
    ax.bar(
        [x + len(engines) * width for x in range(len(batches))],
        floor,
        width,
        label="weight-read floor",
        color="grey",
    )
    ax.set_xticks([x + 0.4 for x in range(len(batches))], [f"batch {b}" for b in batches])
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s (log)")
    ax.set_title(f"1.2B Llama, bf16, {results['env'].get('gpu', '')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(json.dumps({"plot": str(path)}))


if __name__ == "__main__":
    main()
