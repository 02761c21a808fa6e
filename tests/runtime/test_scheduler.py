"""Chunked prefill, preemption by recompute and stops change when work happens, never the tokens."""

import pytest

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.scheduler import Scheduler
from fastpath.runtime.engine.sequence import Sequence, Status
from fastpath.runtime.runner.kv_cache import BlockAllocator

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


def _prefill_spy(llm) -> list[list[tuple[int, int, int]]]:
    """Every prefill step the scheduler hands out: (chunk start, chunk length, prompt length) each."""
    steps = []
    orig = llm.executor.scheduler._schedule_prefill

    def spy():
        batch = orig()
        if batch is not None:
            steps.append(
                [
                    (a, n, len(s.prompt_ids))
                    for s, a, n in zip(batch.seqs, batch.starts, batch.lens, strict=True)
                ]
            )
        return batch

    llm.executor.scheduler._schedule_prefill = spy
    return steps


@pytest.mark.parametrize("blocks", [None, 10], ids=["roomy", "preempting"])
def test_mixed_batches_give_the_same_tokens_and_decode_beside_prefills(reference, blocks):
    kw = dict(
        device="cpu", max_seq_len=128, max_batch_size=8, max_num_batched_tokens=16, kv_cache_blocks=blocks
    )
    llm = LLM("random:tiny-qwen2", mixed_batches=True, **kw)
    assert llm.executor.scheduler.mixed_batches
    steps = _prefill_spy(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == reference
    # A chunk past a sequence's prompt: a decode riding along, in a step that prefills another.
    riding = [step for step in steps if any(start >= plen for start, _, plen in step)]
    assert riding and all(any(start < plen for start, _, plen in step) for step in riding)
    assert all(n == 1 for step in steps for start, n, plen in step if start >= plen and blocks is None)
    assert all(sum(n for _, n, _ in step) <= 16 for step in steps)
    stats = llm.stats()
    assert stats.step_tokens["prefill"] > sum(map(len, PROMPTS)), "prefill steps computed decode tokens too"
    assert stats.kv_blocks_free == stats.kv_blocks_total


def test_without_mixed_batches_a_prefill_step_holds_prompt_chunks_only():
    llm = LLM("random:tiny-qwen2", device="cpu", max_seq_len=128, max_batch_size=8, max_num_batched_tokens=16)
    assert not llm.executor.scheduler.mixed_batches, (
        "the CPU's dense prefill attention is one call per sequence"
    )
    steps = _prefill_spy(llm)
    llm.generate(PROMPTS, PARAMS)
    assert all(start + n <= plen for step in steps for start, n, plen in step), "prompt chunks only"
    stats = llm.stats()
    assert stats.step_tokens["prefill"] == sum(map(len, PROMPTS))
    assert stats.steps["decode"] > 0 and stats.step_seconds["decode"] > 0


def test_mixed_batches_is_a_switch():
    with pytest.raises(ValueError, match="mixed_batches must be True, False or None"):
        LLM("random:tiny-qwen2", device="cpu", mixed_batches="yes")


def test_mixed_batches_refuse_a_token_budget_smaller_than_the_batch():
    # Decodes ride along first: with fewer tokens per step than sequences, no request would be admitted.
    with pytest.raises(ValueError) as err:
        LLM("random:tiny-qwen2", device="cpu", max_batch_size=8, max_num_batched_tokens=4, mixed_batches=True)
    assert str(err.value) == (
        "mixed_batches needs max_num_batched_tokens (4) >= max_batch_size (8), "
        "so a prefill step has room beside every decoding sequence"
    )


# --- a prompt part-way through when blocks run short -------------------------------------------------

LONG = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)


def _running(sched: Scheduler, seq_id: int, prompt: int, computed: int, generated: int = 0) -> Sequence:
    seq = Sequence(seq_id, list(range(3, 3 + prompt)), LONG, 0, frozenset(), 256)
    seq.output_ids = [9] * generated
    seq.status = Status.RUNNING
    assert sched._grow(seq, computed + (generated > 0))
    seq.num_computed = computed
    sched.running.append(seq)
    return seq


def _short_cache(free: int) -> tuple[Scheduler, Sequence, Sequence]:
    """Y is 8 tokens into a 20-token prompt; Z decodes; `free` blocks of 4 tokens are left."""
    sched = Scheduler(BlockAllocator(16), 4, 8, 8, mixed_batches=True)
    y = _running(sched, 1, prompt=20, computed=8)
    z = _running(sched, 2, prompt=3, computed=10, generated=8)  # its next step feeds token 10
    sched.allocator.allocate(sched.allocator.num_free - free)  # other work holds the rest
    return sched, y, z


def test_a_prompt_under_way_takes_the_chunk_the_free_blocks_hold():
    sched, *_ = _short_cache(free=1)
    batch = sched.schedule()
    assert batch.phase == "prefill" and sched.num_preemptions == 0
    chunks = {s.seq_id: (a, n) for s, a, n in zip(batch.seqs, batch.starts, batch.lens, strict=True)}
    assert chunks == {2: (10, 1), 1: (8, 4)}, "Z rides along; Y fills its new block, no more"
    assert batch.samples == [True, False]


def test_a_prompt_under_way_never_decodes_and_waits_for_blocks():
    sched, y, z = _short_cache(free=0)
    batch = sched.schedule()
    assert batch.phase == "decode" and batch.seqs == [z] and y.num_computed == 8
    assert sched.num_preemptions == 0


def test_prompts_under_way_with_no_block_preempt_the_newest_for_the_oldest():
    sched = Scheduler(BlockAllocator(7), 4, 8, 8, mixed_batches=True)
    old = _running(sched, 1, prompt=20, computed=12)  # 3 blocks
    new = _running(sched, 2, prompt=20, computed=12)  # 3 blocks; none free
    batch = sched.schedule()
    assert sched.num_preemptions == 1 and new.status is Status.WAITING and new.num_computed == 0
    assert batch.phase == "prefill" and batch.seqs == [old] and batch.starts == [12]


def test_a_prompt_larger_than_the_whole_cache_is_named():
    sched = Scheduler(BlockAllocator(4), 4, 8, 8, mixed_batches=True)
    _running(sched, 7, prompt=20, computed=12)  # all 3 blocks
    with pytest.raises(
        RuntimeError, match=r"KV cache too small: sequence 7 has 20 tokens, 3 blocks of 4 hold 12"
    ):
        sched.schedule()
