"""Chunked prefill, preemption by recompute and stops change when work happens, never the tokens."""

import pytest

from fastpath.runtime import LLM, SamplingParams

PROMPTS = [list(range(3, 3 + n)) for n in (70, 5, 33, 1, 48, 12)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def reference():
    llm = LLM("random:tiny-qwen2", device="cpu", max_seq_len=128, max_batch_size=8)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]


def test_chunked_prefill_gives_the_same_tokens(reference):
    llm = LLM("random:tiny-qwen2", device="cpu", max_seq_len=128, max_batch_size=8, max_num_batched_tokens=16)
    steps = []
    orig = llm.executor.scheduler._schedule_prefill

    def spy():
        batch = orig()
        if batch is not None:
            steps.append(batch.lens)
        return batch

    llm.executor.scheduler._schedule_prefill = spy
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == reference
    assert all(sum(lens) <= 16 for lens in steps)
    assert any(len(lens) > 1 for lens in steps), "chunks of several requests share a step"
    assert len(steps) >= sum(len(p) for p in PROMPTS) // 16


def test_preemption_by_recompute_gives_the_same_tokens(reference):
    # 9 blocks of 16: not enough for six sequences at once, so the newest are preempted and recomputed.
    llm = LLM("random:tiny-qwen2", device="cpu", max_seq_len=128, max_batch_size=8, kv_cache_blocks=10)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == reference
    assert llm.executor.scheduler.num_preemptions > 0
    assert llm.executor.allocator.num_free == 9, "every block is returned"


def test_stop_tokens_and_eos_end_requests():
    llm = LLM("random:tiny-qwen2", device="cpu", max_seq_len=128)
    free = llm.generate([PROMPTS[1]], PARAMS)[0].outputs[0].token_ids
    stop_at = free[5]
    out = llm.generate(
        [PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop_at])
    )[0]
    assert out.outputs[0].token_ids == free[: free.index(stop_at) + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_at
    llm.eos_ids = frozenset({stop_at})
    eos = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=20))[0]
    assert (
        eos.outputs[0].token_ids == free[: free.index(stop_at) + 1] and eos.outputs[0].finish_reason == "stop"
    )
    ignored = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0]
    assert ignored.outputs[0].token_ids == free and ignored.outputs[0].finish_reason == "length"


def test_max_seq_len_ends_a_request():
    llm = LLM("random:tiny-qwen2", device="cpu", max_seq_len=32)
    out = llm.generate([list(range(3, 23))], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))[
        0
    ]
    assert len(out.outputs[0].token_ids) == 12 and out.outputs[0].finish_reason == "length"
