"""Tensor parallelism on 2 CUDA devices (NCCL): the same fp32 tokens as one device, with CUDA graphs that
capture the all-reduces, and a killed worker ending the run with an error instead of a hang."""

import pytest
import torch
from test_tp_failures import run_scenario

from fastpath.runtime import LLM, RuntimeHooks, SamplingParams
from fastpath.runtime.prologues import FusedDecodePrologue

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]

PROMPTS = [[1, 5, 9, 33, 7], list(range(3, 60)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
CUDA32 = dict(device="cuda", dtype="float32", max_seq_len=256, max_batch_size=4)


def _tokens(path, **kw):
    with LLM(path, **CUDA32, **kw) as llm:
        if kw.get("tp", 1) > 1:
            assert llm.parallel.world == kw["tp"]
            if kw.get("cuda_graphs") is not False:
                assert llm.executor.graphs is not None and llm.executor.graphs.graphs, "decode is graphed"
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("arch", ["llama", "llama-tied-mqa", "qwen2", "qwen3", "mistral"])
def test_tp2_fp32_tokens_equal_tp1_with_graphs(hf_checkpoints, arch):
    path = str(hf_checkpoints[arch])
    assert _tokens(path, tp=2) == _tokens(path)


def test_tp2_eager_equals_tp1(hf_checkpoints):
    path = str(hf_checkpoints["llama"])
    assert _tokens(path, tp=2, cuda_graphs=False) == _tokens(path, cuda_graphs=False)


def test_tp2_with_the_fused_prologue_and_loop_hooks_gives_the_tp1_tokens(hf_checkpoints):
    """The fused prologue looks up this rank's vocabulary slice; the graph sums the slices."""
    path = str(hf_checkpoints["qwen2"])
    hooks = RuntimeHooks(loop_on_execution_stream=True, decode_prologue=FusedDecodePrologue())
    assert _tokens(path, tp=2, hooks=hooks) == _tokens(path)


def test_tp2_sampling_and_logits_match_tp1():
    cfg = dict(device="cuda", dtype="float32", max_seq_len=128, max_batch_size=8)
    prompts = [list(range(3, 3 + n)) for n in (1, 17, 5, 40)]
    params = [SamplingParams(max_tokens=16, ignore_eos=True, temperature=t, seed=4) for t in (0, 0.8) * 2]
    with LLM("random:tiny-qwen3", **cfg) as one:
        want = [o.outputs[0].token_ids for o in one.generate(prompts, params)]
        want_logits = one.prompt_logits(prompts[1])
    with LLM("random:tiny-qwen3", tp=2, **cfg) as two:
        assert [o.outputs[0].token_ids for o in two.generate(prompts, params)] == want
        assert torch.allclose(two.prompt_logits(prompts[1]), want_logits, atol=1e-4)


def test_a_killed_worker_on_cuda_ends_the_run_with_an_error_naming_it():
    report = run_scenario("killed_worker", device="cuda")
    assert report["error"] == "WorkerLost"
    assert report["message"].startswith("tensor-parallel rank 1 (pid ")
    assert report["message"].endswith(") was killed by SIGKILL")


def test_after_warmup_failure_on_cuda_rank_1_stops_every_rank():
    report = run_scenario("after_warmup", device="cuda")
    assert report["error"] == "StartupError"
    assert (
        "start-up failed on rank 1: executor_events.after_warmup hook tp_hooks:fail_on_rank_1"
        in report["message"]
    )


def _probe(model: str, mode: str, hidden: int, lens: list[int]) -> dict:
    """A fresh process's first tensor-parallel engine (tp_allreduce_probe.py)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("tp_allreduce_probe.py")
    done = subprocess.run(
        [sys.executable, str(script), model, mode, str(hidden), *map(str, lens)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _one_rank(model, lens: list[int]) -> list[list[int]]:
    from tp_allreduce_probe import prompts_of

    kw = dict(device="cuda", dtype="float32", max_seq_len=2048, max_batch_size=4)
    with LLM(model, **kw) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        return [o.outputs[0].token_ids for o in llm.generate(prompts_of(lens), params)]


# Every architecture on the fast path; the fallback once (the tests above run it for every one,
# since only a process's first tensor-parallel engine takes symmetric memory).
@pytest.mark.parametrize(
    ("arch", "mode"),
    [(a, "auto") for a in ("llama", "llama-tied-mqa", "qwen2", "qwen3", "mistral")] + [("llama", "nccl")],
)
def test_tp2_gives_the_tp1_tokens_on_each_all_reduce_path(hf_checkpoints, arch, mode):
    """auto: the decode graphs' all-reduces travel through symmetric memory; nccl: the fallback."""
    path, lens = str(hf_checkpoints[arch]), [5, 57, 1, 9]
    got = _probe(path, mode, 0, lens)
    assert got["fast"] == (mode == "auto"), got["path"]
    assert got["tokens"] == _one_rank(path, lens)


def test_tp2_two_shot_prefill_chunks_give_the_tp1_tokens():
    """Hidden 256 in fp32: a 1500-token prefill chunk is 1.5 MiB, past the one-shot's 512 KiB."""
    from fastpath.runtime.model.presets import PRESETS

    lens = [1500, 3]
    got = _probe("wide", "auto", 256, lens)
    assert got["fast"] and got["max_bytes"] > 512 << 10, got["path"]
    cfg = PRESETS["tiny-llama"].replace(hidden_size=256, head_dim=64, random_seed=3)
    assert got["tokens"] == _one_rank(cfg, lens)
