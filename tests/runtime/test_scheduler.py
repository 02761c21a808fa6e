"""Chunked prefill, preemption by recompute and stops change when work happens, never the tokens."""

import pytest

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.scheduler import ScheduledBatch, Scheduler
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


def _running(
    sched: Scheduler,
    seq_id: int,
    prompt: int,
    computed: int,
    generated: int = 0,
    params: SamplingParams = LONG,
) -> Sequence:
    seq = Sequence(seq_id, list(range(3, 3 + prompt)), params, 0, frozenset(), 256)
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


# --- a steady decode batch whose rows cross block boundaries at different steps ---------------------


def _decoding(sched: Scheduler, lengths: list[int], max_tokens: int = 40) -> ScheduledBatch:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    seqs = [_running(sched, i, prompt=n, computed=n, params=params) for i, n in enumerate(lengths)]
    return ScheduledBatch("decode", seqs, samples=[True] * len(seqs))


def _run_steady(sched: Scheduler, batch: ScheduledBatch, steps: int) -> int:
    """Decode `steps` steps (each token taken at once); how many took the pass over every row. Every
    step, fast or not, must find the block its rows write to already in their tables."""
    passes = 0
    for _ in range(steps):
        for s in batch.seqs:
            s.output_ids.append(9)
        passes += batch.horizon == 0
        nxt = sched.continue_decode(batch)
        assert nxt is not None and [s.seq_id for s in nxt.seqs] == [s.seq_id for s in batch.seqs]
        for s in nxt.seqs:  # the step writes token n - 1
            assert len(s.block_table) * sched.block_size >= s.num_tokens
        batch = nxt
    return passes


def test_rows_take_their_next_block_ahead_so_staggered_boundaries_end_a_steady_run_once_a_block():
    # Eight rows at eight different offsets in their blocks of 4: without blocks taken ahead, some
    # row reaches a boundary at every step.
    sched = Scheduler(BlockAllocator(200), 4, 8, 64)
    batch = _decoding(sched, [5 + i for i in range(8)])
    assert _run_steady(sched, batch, 32) <= 32 // 4 + 2
    limit = -(-(12 + 40) // 4)  # the longest prompt plus max_tokens, in blocks
    assert all(len(s.block_table) <= limit for s in sched.running)


def test_a_row_takes_no_block_past_its_length_limit():
    sched = Scheduler(BlockAllocator(200), 4, 8, 64)
    # Prompts of 5, 6 and 7 tokens and 7 new ones: the last token is never fed, so the rows write
    # 11, 12 and 13 tokens: 3, 3 and 4 blocks.
    batch = _decoding(sched, [5, 6, 7], max_tokens=7)
    _run_steady(sched, batch, 6)
    assert [len(s.block_table) for s in batch.seqs] == [3, 3, 4]


def _three_rows(free: int, queued: int = 0) -> tuple[Scheduler, ScheduledBatch]:
    """Rows of 4, 7 and 8 tokens (blocks of 4), a token each taken: two need a block now, and all
    three would take one ahead. `free` blocks left, and a queued prompt of `queued` tokens."""
    sched = Scheduler(BlockAllocator(40), 4, 3, 64)
    batch = _decoding(sched, [4, 7, 8])
    sched.allocator.allocate(sched.allocator.num_free - free)
    if queued:
        sched.add(Sequence(9, list(range(3, 3 + queued)), LONG, 0, frozenset(), 256))
    for s in batch.seqs:
        s.output_ids.append(9)
    return sched, batch


def test_no_block_is_taken_ahead_from_what_the_step_or_the_queue_needs():
    sched, batch = _three_rows(free=2)
    nxt = sched.continue_decode(batch)
    assert [len(s.block_table) for s in nxt.seqs] == [2, 2, 3] and sched.allocator.num_free == 0
    assert nxt.horizon == 0, "row 1 is at its table's end"
    sched, batch = _three_rows(free=5, queued=8)  # 2 now, 3 ahead, 2 for the queue's head: 7
    nxt = sched.continue_decode(batch)
    assert [len(s.block_table) for s in nxt.seqs] == [2, 2, 3] and sched.allocator.num_free == 3
    sched, batch = _three_rows(free=5)
    nxt = sched.continue_decode(batch)
    assert [len(s.block_table) for s in nxt.seqs] == [3, 3, 4] and sched.allocator.num_free == 0
    assert nxt.horizon == 4 and nxt.seqs is batch.seqs  # row 1: 8 tokens of 12 slots
