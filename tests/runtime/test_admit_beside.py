"""Admission beside a step in flight (Scheduler.admit_beside): new requests are prefilled while the
decode step before them runs, their neighbours riding along with tokens still on the device. When
work happens changes; the tokens never do."""

from __future__ import annotations

import pytest
import torch

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.executor import ADMIT_BESIDE_ENV
from fastpath.runtime.engine.scheduler import ScheduledBatch, Scheduler
from fastpath.runtime.engine.sequence import Sequence, Status
from fastpath.runtime.engine.steps import prefill_step
from fastpath.runtime.runner.kv_cache import BlockAllocator

MODEL = "random:tiny-qwen2"
PROMPTS = [list(range(3 + k, 3 + k + n)) for k, n in enumerate((9, 30, 4, 17, 1, 25, 12, 6, 40, 3))]
# Lengths differ, so slots free up while others decode; every sampler path is in the mix.
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=5, ignore_eos=True),
    SamplingParams(
        temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5, max_tokens=9, ignore_eos=True
    ),
    SamplingParams(temperature=0.0, min_tokens=6, max_tokens=14, logprobs=3),
    SamplingParams(temperature=1.0, top_k=20, min_p=0.05, seed=3, max_tokens=7, ignore_eos=True),
    SamplingParams(temperature=0.0, frequency_penalty=0.7, max_tokens=3, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=0),
    SamplingParams(temperature=0.7, seed=11, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
]
ENGINE = dict(device="cpu", max_seq_len=96, max_batch_size=4, max_num_batched_tokens=48, mixed_batches=True)


def _outputs(llm: LLM) -> list[tuple[list[int], list[float] | None, str]]:
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.outputs[0].finish_reason) for o in outs]


def _spy(llm: LLM) -> list[ScheduledBatch]:
    """Every batch admit_beside hands out."""
    sched, seen = llm.executor.scheduler, []
    orig = sched.admit_beside

    def spy(prev):
        batch = orig(prev)
        if batch is not None:
            seen.append(batch)
        return batch

    sched.admit_beside = spy
    return seen


@pytest.fixture(scope="module")
def solo():
    """Each request alone: nothing to admit beside."""
    llm = LLM(MODEL, **ENGINE)
    out = []
    for prompt, params in zip(PROMPTS, PARAMS, strict=True):
        o = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        out.append((o.token_ids, o.logprobs, o.finish_reason))
    return out


def _same(got, want) -> None:
    for (ids, lps, reason), (ids_w, lps_w, reason_w) in zip(got, want, strict=True):
        assert ids == ids_w and reason == reason_w
        if lps_w is not None:  # vLLM's shape: per position, {token id: Logprob}
            assert [sorted(d) for d in lps] == [sorted(d) for d in lps_w]
            flat = [[d[t].logprob for t in sorted(d)] for d in lps]
            flat_w = [[d[t].logprob for t in sorted(d)] for d in lps_w]
            torch.testing.assert_close(torch.tensor(flat), torch.tensor(flat_w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("blocks", [None, 14], ids=["roomy", "tight"])
def test_requests_admitted_beside_a_step_in_flight_get_their_solo_tokens(solo, blocks):
    llm = LLM(MODEL, kv_cache_blocks=blocks, **ENGINE)
    assert llm.executor.admits_beside
    beside = _spy(llm)
    _same(_outputs(llm), solo)
    assert beside, "some request was admitted while a decode step was in flight"
    for batch in beside:  # riders first, one in-flight token each; then prompts from their start
        riders = [i for i, s in enumerate(batch.seqs) if batch.starts[i] >= len(s.prompt_ids)]
        assert riders == list(range(len(riders))) and all(batch.lens[i] == 1 for i in riders)
        assert len(riders) < len(batch.seqs)
    stats = llm.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total and stats.running == stats.waiting == 0


def test_the_switch_turns_it_off_and_changes_no_token(solo, monkeypatch):
    monkeypatch.setenv(ADMIT_BESIDE_ENV, "0")
    llm = LLM(MODEL, **ENGINE)
    assert not llm.executor.admits_beside
    beside = _spy(llm)
    _same(_outputs(llm), solo)
    assert not beside


# --- the scheduler alone ------------------------------------------------------------------------

GREEDY = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)


def _seq(i: int, n: int, guided=None) -> Sequence:
    return Sequence(i, list(range(3, 3 + n)), GREEDY, 0, frozenset(), 256, guided=guided)


def _in_flight(sched: Scheduler, seqs: list[Sequence]) -> ScheduledBatch:
    """`seqs` running, a decode step of them launched: one token each sampled and not read back."""
    for s in seqs:
        s.output_ids = [5]
        s.status = Status.RUNNING
        sched._grow(s, s.num_tokens)
        s.num_computed = s.num_tokens
        s.num_pending = 1
        sched.running.append(s)
    return ScheduledBatch("decode", list(seqs), samples=[True] * len(seqs))


def _scheduler(blocks: int = 64, mixed: bool = True) -> Scheduler:
    return Scheduler(BlockAllocator(blocks), 4, 8, 64, mixed_batches=mixed)


def test_riders_feed_their_token_in_flight_and_new_prompts_start_at_zero():
    sched = _scheduler()
    prev = _in_flight(sched, [_seq(0, 6), _seq(1, 3)])
    new = _seq(2, 10)
    sched.add(new)
    batch = sched.admit_beside(prev)
    assert batch is not None and batch.phase == "prefill"
    assert [s.seq_id for s in batch.seqs] == [0, 1, 2]
    assert batch.starts == [7, 4, 0] and batch.lens == [1, 1, 10] and batch.samples == [True] * 3
    assert new in sched.running and not sched.waiting and new.scheduled_at is not None
    step, sampled = prefill_step(batch, 4, src_rows={0: 0, 1: 1})
    assert sampled == batch.seqs
    # The riders' tokens (positions 7 and 4) come from rows 0 and 1 of the step in flight.
    assert step.pending.tolist() == [[0, 0], [1, 1]]
    assert step.positions.tolist()[:2] == [7, 4] and step.ids.tolist()[2:] == new.prompt_ids


def test_a_rider_whose_token_is_unknown_needs_the_step_in_flight():
    sched = _scheduler()
    prev = _in_flight(sched, [_seq(0, 6)])
    sched.add(_seq(1, 2))
    batch = sched.admit_beside(prev)
    with pytest.raises(RuntimeError, match="sequence 0: tokens 7..8 are not all known"):
        prefill_step(batch, 4)


@pytest.mark.parametrize(
    "case", ["not mixed", "nobody waits", "prefill in flight", "guided rider", "no blocks", "batch full"]
)
def test_admission_waits_for_the_host_when_it_must(case):
    sched = _scheduler(blocks=5 if case == "no blocks" else 64, mixed=case != "not mixed")
    seqs = [_seq(0, 6, guided=object() if case == "guided rider" else None)]
    if case == "batch full":
        seqs += [_seq(i, 2) for i in range(1, 8)]
    prev = _in_flight(sched, seqs)
    if case == "prefill in flight":
        prev = ScheduledBatch("prefill", prev.seqs, [0], [7], [True])
    if case != "nobody waits":
        sched.add(_seq(9, 12))
    free = sched.allocator.num_free
    assert sched.admit_beside(prev) is None
    assert case == "no blocks" or sched.allocator.num_free == free, "nothing allocated"


def test_a_guided_request_waits_for_the_full_scheduler():
    sched = _scheduler()
    prev = _in_flight(sched, [_seq(0, 6)])
    plain, guided, later = _seq(1, 3), _seq(2, 3, guided=object()), _seq(3, 3)
    for s in (plain, guided, later):
        sched.add(s)
    batch = sched.admit_beside(prev)
    assert [s.seq_id for s in batch.seqs] == [0, 1], "admission stops at the guided one, in order"
    assert list(sched.waiting) == [guided, later]


def test_a_sequence_at_its_last_token_does_not_ride():
    sched = _scheduler()
    last = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)  # output + pending = 2
    done = Sequence(0, list(range(3, 9)), last, 0, frozenset(), 256)
    prev = _in_flight(sched, [done, _seq(1, 3)])
    sched.add(_seq(2, 5))
    batch = sched.admit_beside(prev)
    assert [s.seq_id for s in batch.seqs] == [1, 2]
