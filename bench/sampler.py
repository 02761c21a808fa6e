"""The general sampler's kernels on their own, per kernel, beside greedy's argmax (needs CUDA).

    python bench/sampler.py --out bench/results [--batch 8 64 256] [--variants 4096x1024x8 8192x1024x8]
                            [--bias none logit allow]

Each row is one captured graph of `sampling_triton.sample` over random logits of a 128k vocabulary
with decode.py's sampled-with-penalties settings (SAMPLED) in every row, timed by replay, with the
profiler's time per kernel. A variant is CHUNKxBLOCKxWARPS of the row-parallel passes. The greedy
row is what the greedy graph samples with: an argmax and a log-softmax of the same logits.
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import markdown_table, replay_seconds, write_outputs

VOCAB = 128256


def inputs(batch: int, scale: float, device: str, bias: str = "none"):
    from decode import SAMPLED

    from fastpath.runtime.kernels.sampling import BIAS_BIT, PROMPT_BIT, STOP_BIT
    from fastpath.runtime.runner.penalties import PenaltyTable
    from fastpath.runtime.runner.sampler import TOP_LOGPROBS, SamplingTensors

    g = torch.Generator(device="cpu").manual_seed(0)
    logits = (torch.randn(batch, VOCAB, generator=g) * scale).to(device, torch.bfloat16)
    table = PenaltyTable(batch + 1, VOCAB, torch.device(device))
    for slot in range(1, batch + 1):  # a 64-token prompt, 32 generated tokens and a stop token
        toks = torch.randint(0, VOCAB, (97,), generator=g).to(device)
        table.entries[slot, toks[:64]] |= PROMPT_BIT
        table.entries[slot, toks[64:96]] += 1
        table.entries[slot, toks[96:]] |= STOP_BIT
        if bias == "allow":  # an allow-list: every entry carries the bias bit, all but 64 at -inf
            table.entries[slot] |= BIAS_BIT
            table.biases[slot] = float("-inf")
        if bias != "none":  # 64 tokens with a logit_bias (or, for "allow", the allowed ones)
            listed = torch.randint(0, VOCAB, (64,), generator=g).to(device)
            table.entries[slot, listed] |= BIAS_BIT
            table.biases[slot, listed] = torch.randn(64, generator=g).to(device)
    table.bits.copy_(table._pack(list(range(batch + 1))))
    cols = {
        "temperature": [SAMPLED["temperature"]] * batch,
        "top_p": [SAMPLED["top_p"]] * batch,
        "top_k": [SAMPLED["top_k"]] * batch,
        "min_p": [SAMPLED["min_p"]] * batch,
        "repetition": [SAMPLED["repetition_penalty"]] * batch,
        "presence": [SAMPLED["presence_penalty"]] * batch,
        "frequency": [SAMPLED["frequency_penalty"]] * batch,
        "slots": list(range(1, batch + 1)),
    }
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    p = SamplingTensors.neutral(batch, seeds=seeds, **cols)
    # A step computes TOP_LOGPROBS whenever any row asks for logprobs.
    return logits, SamplingTensors(p.data.to(device)), table, TOP_LOGPROBS


def greedy(logits: torch.Tensor):
    x = logits.float()
    return x.argmax(-1), torch.log_softmax(x, -1)


def timed(fn, replays: int) -> tuple[float, dict[str, float]]:
    """(seconds per replay of fn captured in a graph, µs per replay of each kernel)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    seconds = min(replay_seconds(graph, replays) for _ in range(3))
    kernels: dict[str, float] = collections.Counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            kernels[e.key] += e.device_time_total / replays
    return seconds, dict(kernels)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["4096x1024x8", "4096x512x4", "4096x512x8", "2048x512x4", "8192x512x4"],
    )
    ap.add_argument("--scale", type=float, default=2.0, help="standard deviation of the random logits")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument(
        "--bias",
        nargs="+",
        choices=["none", "logit", "allow"],
        default=["none"],
        help="rows with no bias, a 64-token logit_bias, or a 64-token allow-list (every entry biased)",
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/sampler.py needs a CUDA device")
        return
    from fastpath.runtime.kernels import sampling_triton as S
    from fastpath.runtime.kernels.triton_ops import TritonOps
    from fastpath.runtime.runner.penalties import PenaltyTable

    rows, payload = [], {"vocab": VOCAB, "scale": args.scale, "rows": []}
    for b, bias in itertools.product(args.batch, args.bias):
        logits, p, table, top = inputs(b, args.scale, "cuda", bias)
        label = "" if bias == "none" else f", {bias} bias"

        base, _ = timed(functools.partial(greedy, logits), args.replays)
        if bias == "none":
            rows.append([b, "greedy (argmax, log-softmax)", f"{base * 1e6:.1f}", "", ""])
            payload["rows"].append({"batch": b, "variant": "greedy", "us": base * 1e6})
            engine, _ = timed(functools.partial(TritonOps().greedy, logits), args.replays)
            rows.append([b, "greedy (the engine's fused argmax)", f"{engine * 1e6:.1f}", "", ""])
            payload["rows"].append({"batch": b, "variant": "engine greedy", "us": engine * 1e6})
        for variant in args.variants:
            chunk, block, warps = (int(v) for v in variant.split("x"))
            S.PASS_WARPS = warps
            # A copy of the table, not of its entries view: a row's biases sit beside its entries.
            copy = PenaltyTable(b + 1, VOCAB, torch.device("cuda"))
            copy._padded.copy_(table._padded)
            entries, bits = copy.entries, table.bits.clone()

            general = functools.partial(S.sample, logits, p, entries, bits, top, chunk=chunk, block=block)
            seconds, kernels = timed(general, args.replays)
            split = ", ".join(f"{k} {v:.0f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:6])
            rows.append(
                [b, f"general {variant}{label}", f"{seconds * 1e6:.1f}", f"{seconds / base:.2f}×", split]
            )
            payload["rows"].append(
                {
                    "batch": b,
                    "variant": variant,
                    "bias": bias,
                    "us": seconds * 1e6,
                    "kernels_us": kernels,
                }
            )
            print(rows[-1], flush=True)
    table_md = markdown_table(["batch", "sampler", "µs/replay", "vs greedy", "µs per kernel"], rows)
    print(table_md)
    write_outputs(args.out, "sampler", payload, table_md)


if __name__ == "__main__":
    main()
