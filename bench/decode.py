#!/usr/bin/env python3
"""Decode throughput on a GPU, side by side in one run: the native engine's variants, HF transformers
`generate`, a gpt-fast-style torch.compile peer of the same shape (bench/compile_peer.py), and the
weight-read floor (weight bytes over the copy bandwidth measured in this run).

    python bench/decode.py --out bench/results [--quick] [--batch 1 8 64 256] [--tp 2] [--sampling greedy]
        [--long-context 8192] [--package llama_1b --alternate 5] [--device cpu]

Steady-state decode time per step is the difference between two generations that differ only in
length, so prefill, warmup and start-up cancel out. Each native row runs greedy and "sampled with
penalties" (SAMPLED: temperature, top-p, top-k, min-p, the three penalties and top-5 logprobs, every
request with its own seed): the general sampler inside the same decode graphs. `--tp 2` adds
tensor-parallel rows (2 GPUs, NCCL all-reduces inside the decode graphs) beside the one-GPU rows; a
tensor-parallel row's floor is its rank's weight bytes over the copy bandwidth, since every GPU
streams its shard at once.

Two figures per native row: "µs/step" is the engine's own count of its decode steps (the time from
one step's delivery to the next, while the loop runs without a pause), a long run's less a short
run's over the steps between them, so the first and last steps of a run cancel; beside it, the same
difference of the two runs' wall times, which also holds the caller's work (building outputs).
"replay µs" is the step's graph replayed back to back, host work left out, so "wall / replay" above 1
is time the host adds to a step. The graph replays at the timed steps' mean context (a last run of
that length leaves its inputs there), since attention's time grows with the context. "host µs" is
the host's own work in a step (scheduling, staging, launching, completing), counted as the step
less the time the engine loop waited for the device: the host keeps ahead while it is below the
replay. A row's floor is the larger of its weight bytes (plus the KV bytes attention reads) over the copy bandwidth and its
matrix FLOPs over the bf16 matrix rate, both measured in this run. `--long-context N` adds a batch-8
row whose prompts are N tokens long, where attention's reads of the KV cache dominate, and reports the
bandwidth attention reaches on them (the extra KV bytes over the extra replay time).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    copy_bandwidth,
    counted_run,
    environment,
    markdown_table,
    matmul_peak,
    replay_seconds,
    wall,
    write_outputs,
)
from gpu_clocks import ClockLog

from fastpath.runtime.model.presets import resolve_random

MODEL = "random:llama-1b"
PEER = "torch.compile + CUDA graph (gpt-fast style, bench/compile_peer.py)"
PROMPT_LEN = 32
SAMPLED = dict(
    temperature=0.8, top_p=0.95, top_k=50, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
    frequency_penalty=0.5, logprobs=5,
)  # fmt: skip


def phase_workload(llm, batch: int, kind: str, tokens: int) -> tuple[list[list[int]], list]:
    """host_phases.py's and step_timeline.py's requests: `batch` random prompts of PROMPT_LEN tokens,
    greedy or ("penalties") SAMPLED, each with its own seed and `tokens` new tokens."""
    from fastpath.runtime import SamplingParams

    g = torch.Generator().manual_seed(0)
    vocab = llm.config.model.vocab_size
    prompts = [torch.randint(0, vocab, (PROMPT_LEN,), generator=g).tolist() for _ in range(batch)]
    extra = SAMPLED if kind == "penalties" else {"temperature": 0.0}
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True, seed=i, **extra) for i in range(batch)]
    return prompts, params


def weight_bytes(llm) -> int:
    seen, total = set(), 0
    for p in llm.executor.model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def engine_step_time(
    llm, batch: int, short: int, long: int, repeats: int, sampled: bool = False, prompt_len: int = PROMPT_LEN
) -> tuple[float, float, list[float], float]:
    """A steady decode step, each figure a median over repeats: the engine's counted decode seconds
    of a long run less a short one's, over the steps between them (a run's first and last steps, which
    overlap nothing, cancel), and the same difference of wall times (the caller's work included); then
    every long run's counted mean step (a one-time cost inside one run shows there); last, the host's
    work in a step, counted the same way: the step less the time the loop waited for the device."""
    from fastpath.runtime import SamplingParams

    g = torch.Generator().manual_seed(batch)
    vocab = llm.config.model.vocab_size
    low, high = min(1000, vocab // 4), min(100000, vocab)
    prompts = [torch.randint(low, high, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    extra = SAMPLED if sampled else {"temperature": 0.0}

    def run(n) -> tuple[float, float, float, int]:
        """(wall seconds, counted decode seconds, of them waiting for the device, decode steps) of one
        generation of n tokens a row."""
        params = [SamplingParams(max_tokens=n, ignore_eos=True, seed=i, **extra) for i in range(batch)]
        return counted_run(llm, lambda: llm.generate(prompts, params))

    run(short)  # first use of this batch size: nothing lazy left in the timed runs
    counted, diffs, means, host = [], [], [], []
    for _ in range(repeats):
        wall_long, counted_long, waited_long, steps_long = run(long)
        wall_short, counted_short, waited_short, steps_short = run(short)
        steps = max(steps_long - steps_short, 1)
        counted.append((counted_long - counted_short) / steps)
        host.append((counted_long - waited_long - counted_short + waited_short) / steps)
        diffs.append((wall_long - wall_short) / (long - short))
        means.append(counted_long / max(steps_long, 1))
    # The graph's inputs are left at the timed steps' mean context (the "context" column) for the
    # replay columns; the short run last would leave them (long - short) / 2 tokens short of it.
    run((short + long) // 2 + 1)
    return statistics.median(counted), statistics.median(diffs), means, statistics.median(host)


def matmul_flops_per_token(model: str, context: int) -> float:
    """A decode token's matrix FLOPs: every weight matrix once, and attention over `context` keys."""
    cfg = resolve_random(model)
    params = cfg.num_parameters() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    return 2 * params + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context


def kv_bytes_per_token(model: str) -> int:
    cfg = resolve_random(model)
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2  # K and V, bf16


def decode_graph(llm, batch: int, kind: str) -> torch.cuda.CUDAGraph | None:
    """The decode graph the engine runs `batch` rows of `kind` ("greedy" or "general") in; None when
    it runs them without one."""
    graphs = llm.executor.runner.graphs
    rows = graphs.bucket(batch) if graphs is not None else None
    if rows is None or (rows, kind) not in graphs.graphs:
        return None
    return graphs.graphs[(rows, kind)].graph


def replay_time(llm, batch: int, kind: str, replays: int = 50) -> float | None:
    """The step's graph replayed back to back, host work left out: what the GPU alone takes."""
    graph = decode_graph(llm, batch, kind)
    if graph is None:
        return None
    stream = llm.executor.runner.execution_stream
    with torch.cuda.stream(stream):
        for _ in range(3):
            graph.replay()
        return replay_seconds(graph, replays)


def sustained_replay_time(llm, batch: int, kind: str, seconds: float = 1.0) -> float | None:
    """The step's graph replayed back to back for about `seconds`, timed in chunks: the median chunk of
    the second half, once the GPU's clock and power have settled under the load (the replay column is
    a burst of 50 right after the engine's runs)."""
    graph = decode_graph(llm, batch, kind)
    if graph is None:
        return None
    chunks, spent = [], 0.0
    with torch.cuda.stream(llm.executor.runner.execution_stream):
        while spent < seconds or len(chunks) < 4:
            chunks.append(replay_seconds(graph, 25))
            spent += chunks[-1] * 25
    return statistics.median(chunks[len(chunks) // 2 :])


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


def kernels(results: dict, name: str, llm) -> None:
    """What runs the engine's per-token work (which kernels, PDL, the tensor-core GEMV), as its log says
    it, into the results: a kernel that fails to build falls back without failing the run."""
    executor = getattr(llm, "executor", None)
    runner = getattr(executor, "runner", None)
    if runner is not None:
        results.setdefault("kernels", {})[name] = runner.model.ops.describe(runner.config.device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument(
        "--model", default=MODEL, help="a random: preset (random:llama-8b for tensor parallelism)"
    )
    ap.add_argument("--name", default="decode", help="the output files' stem")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-compile-peer", action="store_true", help="skip the torch.compile peer rows")
    ap.add_argument("--variants", nargs="+", default=["fused", "torch-ops"], help="native variants to run")
    ap.add_argument("--package", action="append", default=[], help="generated package to run beside native")
    ap.add_argument(
        "--alternate", type=int, default=0, metavar="N",
        help="N runs a batch, alternating native and each --package (or, with none, a second native "
        "engine: the method's own spread); reports each one's median and spread",
    )  # fmt: skip
    ap.add_argument("--tp", type=int, nargs="*", default=[], help="tensor-parallel sizes to run beside tp=1")
    ap.add_argument(
        "--sampling", nargs="+", choices=["greedy", "penalties"], default=["greedy", "penalties"],
        help="native rows: greedy, and sampled with penalties (SAMPLED)",
    )  # fmt: skip
    ap.add_argument(
        "--long-context", type=int, metavar="N",
        help="add a batch-8 row of N-token prompts (default 8192 on CUDA; 0 leaves it out)",
    )  # fmt: skip
    ap.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda",
        help="cpu: a smoke run of the bench itself (no graphs, peers or HF rows), for tests",
    )  # fmt: skip
    ap.add_argument(
        "--stack-dump-s", type=float, default=0, help="print every thread's stack every S seconds"
    )
    args = ap.parse_args()
    if args.stack_dump_s:  # a run stuck in C++ (a collective, say) still says where
        faulthandler.dump_traceback_later(args.stack_dump_s, repeat=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/decode.py needs a CUDA device; none is visible")
        return
    if args.device == "cpu":
        args.no_hf = args.no_compile_peer = True
    if args.long_context is None:
        args.long_context = 8192 if args.device == "cuda" else 0
    from fastpath.runtime import LLM

    short, long, repeats = (8, 40, 3) if args.quick else (16, 144, 3)
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    gib = 2.0 if args.device == "cuda" else 0.125
    clocks = ClockLog.start(torch.cuda.current_device()) if args.device == "cuda" else ClockLog()
    bw = copy_bandwidth(gib, device=args.device)
    peak = matmul_peak(8192 if args.device == "cuda" else 512, device=args.device)
    results = {"env": environment(), "copy_bandwidth_bytes_per_s": bw, "matmul_flop_per_s": peak, "rows": []}
    results["alternating"] = []
    max_batch = max(args.batch)
    engines = {
        "fused": dict(fused_kernels=True),
        "torch-ops": dict(fused_kernels=False),
        "no-graphs": dict(cuda_graphs=False),
    }
    kv_token = kv_bytes_per_token(args.model)

    def floor(rank_bytes: int, batch: int, context: int, tp: int = 1) -> float:
        reads = rank_bytes + batch * context * kv_token / tp
        return max(reads / bw, batch * matmul_flops_per_token(args.model, context) / tp / peak)

    def measure(llm, name, tp, variant, batch, sampling, prompt_len=PROMPT_LEN):
        rank_bytes = weight_bytes(llm)
        label = name if sampling == "greedy" else f"{name}, sampled with penalties"
        with clocks.phase(f"{label} b{batch} engine"):
            step, diff, counted, host = engine_step_time(
                llm, batch, short, long, repeats, sampled=sampling == "penalties", prompt_len=prompt_len
            )
        context = prompt_len + (short + long) // 2
        row = {"engine": label, "batch": batch, "step_s": step, "diff_step_s": diff, "tp": tp}
        row["counted_mean_step_s"] = counted
        row["host_step_s"] = host
        row |= {"variant": variant, "sampling": sampling, "context": context}
        row |= {"floor_step_s": floor(rank_bytes, batch, context, tp), "kv_bytes": batch * context * kv_token}
        # A tensor-parallel graph replayed on rank 0 alone waits forever in its all-reduce for the others.
        kind = "greedy" if sampling == "greedy" else "general"
        row["replay_s"] = replay_time(llm, batch, kind) if tp == 1 else None
        if tp == 1 and args.device == "cuda":
            with clocks.phase(f"{label} b{batch} replay"):
                row["replay_sustained_s"] = sustained_replay_time(llm, batch, kind)
            row["clocks_engine"] = clocks.summary(f"{label} b{batch} engine")
            row["clocks_replay"] = clocks.summary(f"{label} b{batch} replay")
        row["allreduce"] = llm.parallel.tp.allreduce_path if llm.parallel is not None else None
        results["rows"].append(row)
        print(f"{label} batch {batch} context {context}: {step * 1e6:.0f} us/step counted, {diff * 1e6:.0f} us/step"
              f" by difference (long runs' counted means: {[round(c * 1e6) for c in counted]}), replay {row['replay_s'] and row['replay_s'] * 1e6}", flush=True)  # fmt: skip

    def release(llm):
        report()
        llm.close()
        del llm
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()

    def report() -> None:
        """The table from the rows so far: written after each stage, so a run cut short keeps them."""
        nonlocal floor_bytes
        if floor_bytes is None:  # only tensor-parallel rows ran: the one-GPU floor from the parameter count
            floor_bytes = resolve_random(args.model).num_parameters() * 2
        context = PROMPT_LEN + (short + long) // 2
        results["weight_bytes"] = floor_bytes
        results["floor_step_s"] = floor_bytes / bw
        hf = {r["batch"]: r["step_s"] for r in results["rows"] if r["engine"].startswith("HF")}
        peer = {r["batch"]: r["step_s"] for r in results["rows"] if r["engine"] == PEER}
        greedy = {
            (r["variant"], r["tp"], r["batch"]): r
            for r in results["rows"]
            if r.get("sampling") == "greedy" and r.get("context") == context
        }
        rows = []
        for r in results["rows"]:
            b, step = r["batch"], r["step_s"]
            r.setdefault("floor_step_s", floor(floor_bytes, b, context))
            r["tok_s"] = b / step
            r["share_of_floor"] = r["floor_step_s"] / step
            # The peers ran the short context only: a long-context row has nothing to be compared with.
            same = r.get("context", context) == context
            r["speedup_vs_hf"] = hf[b] / step if b in hf and same else None
            r["speedup_vs_compile"] = peer[b] / step if b in peer and same and r["engine"] != PEER else None
            base = greedy.get((r.get("variant"), 1, b)) if r.get("tp", 1) > 1 else None
            r["speedup_vs_tp1"] = base["step_s"] / step if base else None
            plain = (
                greedy.get((r.get("variant"), r.get("tp"), b)) if r.get("sampling") == "penalties" else None
            )
            r["vs_greedy"] = step / plain["step_s"] - 1 if plain else None
            short_ctx = greedy.get((r.get("variant"), 1, b)) if r.get("context", context) > context else None
            if short_ctx and r.get("replay_s") and short_ctx.get("replay_s"):
                extra_bytes = r["kv_bytes"] - short_ctx["kv_bytes"]
                r["attention_kv_bandwidth"] = extra_bytes / max(r["replay_s"] - short_ctx["replay_s"], 1e-9)
                r["attention_kv_share_of_copy"] = r["attention_kv_bandwidth"] / bw
            replay, diff, host = r.get("replay_s"), r.get("diff_step_s"), r.get("host_step_s")
            rows.append([r["engine"], b, r.get("context", "-"), f"{r['tok_s']:.0f}", f"{step * 1e6:.0f}",
                         f"{diff * 1e6:.0f}" if diff else "-",
                         f"{replay * 1e6:.0f}" if replay else "-", f"{step / replay:.2f}" if replay else "-",
                         f"{host * 1e6:.0f}" if host is not None else "-",
                         f"{r['floor_step_s'] * 1e6:.0f}", f"{100 * r['share_of_floor']:.0f}%",
                         f"{r['speedup_vs_compile']:.2f}x" if r["speedup_vs_compile"] else "-",
                         f"{r['speedup_vs_hf']:.1f}x" if r["speedup_vs_hf"] else "-",
                         f"{r['speedup_vs_tp1']:.2f}x" if r["speedup_vs_tp1"] else "-",
                         f"{100 * r['vs_greedy']:+.1f}%" if r["vs_greedy"] is not None else "-"])  # fmt: skip
        headers = ["engine", "batch", "context", "tok/s", "µs/step", "µs/step (difference)", "replay µs",
                   "wall / replay", "host µs", "floor µs", "share of floor", "vs torch.compile", "vs HF", "vs tp=1",
                   "vs greedy"]  # fmt: skip
        table = markdown_table(headers, rows)
        table += (
            f"\n\nCopy bandwidth {bw / 1e12:.2f} TB/s; bf16 matrix rate {peak / 1e12:.0f} TFLOP/s; weights "
            f"{floor_bytes / 1e9:.2f} GB; {results['env']}"
        )
        for name, said in results.get("kernels", {}).items():
            table += f"\n\n{name}: {said}."
        for r in results["rows"]:
            if "attention_kv_bandwidth" in r:
                table += (
                    f"\n\n{r['engine']}: attention reads {r['kv_bytes'] / 1e9:.2f} GB of KV cache a step at "
                    f"{r['attention_kv_bandwidth'] / 1e12:.2f} TB/s ({100 * r['attention_kv_share_of_copy']:.0f}% of the "
                    "copy bandwidth), from the extra replay time over the short-context row."
                )
        if results["alternating"]:
            alt = [[a["engine"], a["batch"], a["runs"], f"{a['median_s'] * 1e6:.0f}", f"{a['spread_s'] * 1e6:.0f}",
                    f"{a['native_median_s'] * 1e6:.0f}", f"{a['native_spread_s'] * 1e6:.0f}",
                    f"{100 * a['vs_native']:+.2f}%"] for a in results["alternating"]]  # fmt: skip
            table += "\n\nAlternating runs:\n\n" + markdown_table(
                ["engine", "batch", "runs", "median µs/step", "spread µs", "native median", "native spread", "vs native"], alt
            )  # fmt: skip
        settled = [r for r in results["rows"] if r.get("replay_sustained_s")]
        if settled:
            mhz = lambda c, k: f"{c[k]:.0f}" if c else "-"  # noqa: E731
            table += "\n\nThe replay settled, and the GPU's clocks (nvidia-smi, medians):\n\n" + markdown_table(
                ["engine", "batch", "replay µs (50, burst)", "replay µs (~1 s, settled)", "µs/step / settled",
                 "SM MHz: engine", "SM MHz: replay", "W: engine", "W: replay"],
                [[r["engine"], r["batch"], f"{r['replay_s'] * 1e6:.0f}", f"{r['replay_sustained_s'] * 1e6:.0f}",
                  f"{r['step_s'] / r['replay_sustained_s']:.2f}",
                  mhz(r["clocks_engine"], "sm_mhz"), mhz(r["clocks_replay"], "sm_mhz"),
                  mhz(r["clocks_engine"], "power_w"), mhz(r["clocks_replay"], "power_w")] for r in settled],
            )  # fmt: skip
        paths = sorted({r["allreduce"] for r in results["rows"] if r.get("allreduce")})
        table += "".join(f"\n\nTensor-parallel all-reduce: {p}." for p in paths)
        results["model"] = args.model
        table += f"\n\nModel {args.model}."
        write_outputs(args.out, args.name, results, table)
        plot(results, args.out / f"{args.name}.png")

    floor_bytes = None
    sizes = [1, *sorted({t for t in args.tp if t > 1})]
    for variant in args.variants:
        for tp in sizes:
            if tp > 1 and tp > torch.cuda.device_count():
                print(f"skipping tp={tp}: {torch.cuda.device_count()} CUDA devices are visible", flush=True)
                continue
            llm = LLM(
                args.model,
                device=args.device,
                dtype=dtype,
                max_batch_size=max_batch,
                max_seq_len=512,
                tp=tp,
                **engines[variant],
            )
            if tp == 1:
                floor_bytes = floor_bytes or weight_bytes(llm)
            name = f"native ({variant})" if tp == 1 else f"native ({variant}, tp={tp})"
            kernels(results, name, llm)
            for b in args.batch:
                for sampling in args.sampling:
                    measure(llm, name, tp, variant, b, sampling)
            release(llm)
        if args.long_context:
            n = args.long_context
            llm = LLM(
                args.model,
                device=args.device,
                dtype=dtype,
                max_batch_size=8,
                max_seq_len=n + long + 64,
                **engines[variant],
            )
            measure(llm, f"native ({variant}), {n}-token contexts", 1, variant, 8, "greedy", prompt_len=n)
            release(llm)
    if args.alternate:
        alternate(args, results, short, long)
    for pkg in args.package:
        module = __import__(pkg)
        llm = module.LLM(
            model=MODEL, device="cuda", dtype="bfloat16", max_batch_size=max_batch, max_seq_len=512
        )
        for b in args.batch:
            step, diff, _, host = engine_step_time(llm, b, short, long, repeats)
            results["rows"].append(
                {
                    "engine": f"generated {pkg}",
                    "batch": b,
                    "step_s": step,
                    "diff_step_s": diff,
                    "host_step_s": host,
                }
            )
            print(f"generated {pkg} batch {b}: {step * 1e6:.0f} us/step", flush=True)
        release(llm)
    report()
    if not args.no_compile_peer:
        from compile_peer import step_time as peer_step_time

        hf_dict = resolve_random(args.model).to_hf_dict()
        for b in args.batch:
            step = peer_step_time(hf_dict, b, PROMPT_LEN, short, long, repeats)
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
    clocks.close()
    report()


def alternate(args, results: dict, short: int, long: int) -> None:
    """Native beside each package (or beside a second native engine), one run each in turn, so drift
    in the machine lands on both alike; each package's median against native's, with both spreads."""
    from fastpath.runtime import LLM

    def native():
        return LLM(args.model, device=args.device, dtype="bfloat16" if args.device == "cuda" else "float32",
                   max_batch_size=max(args.batch), max_seq_len=512, fused_kernels=args.device == "cuda")  # fmt: skip

    engines = {"native": native()}
    for pkg in args.package or [None]:
        if pkg is None:
            engines["native, a second engine"] = native()
        else:
            engines[f"generated {pkg}"] = __import__(pkg).LLM(
                model=args.model, device=args.device, dtype="bfloat16", max_batch_size=max(args.batch),
                max_seq_len=512,
            )  # fmt: skip
    try:
        for b in args.batch:
            steps: dict[str, list[float]] = {name: [] for name in engines}
            for i in range(args.alternate):
                order = list(engines.items())
                for name, llm in order if i % 2 == 0 else order[::-1]:
                    steps[name].append(engine_step_time(llm, b, short, long, 1)[0])
            base = statistics.median(steps["native"])
            for name, runs in steps.items():
                if name == "native":
                    continue
                mid = statistics.median(runs)
                results["alternating"].append(
                    {"engine": name, "batch": b, "runs": args.alternate, "median_s": mid, "native_median_s": base,
                     "spread_s": max(runs) - min(runs), "native_spread_s": max(steps["native"]) - min(steps["native"]),
                     "vs_native": mid / base - 1, "steps_s": runs, "native_steps_s": steps["native"]}
                )  # fmt: skip
                print(f"{name} batch {b}: {mid * 1e6:.0f} us/step against native {base * 1e6:.0f} "
                      f"({100 * (mid / base - 1):+.2f}%) over {args.alternate} alternating runs", flush=True)  # fmt: skip
    finally:
        for llm in engines.values():
            llm.close()


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
