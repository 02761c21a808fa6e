"""The general sampler's state and choices: a request's tokens do not depend on its batch, on chunked
prefill, preemption, tensor parallelism or slot reuse; the greedy fast path stays for batches that
need nothing more; and sampler values that used to break a step (issue 15) sample sensibly."""

import pytest
import torch
from test_sampling_controls import chosen_logprobs, token_ids

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.sampling_rows import SamplingRows
from fastpath.runtime.engine.sequence import Sequence
from fastpath.runtime.engine.steps import any_needs_general, decode_step, needs_general, sampling_tensors
from fastpath.runtime.kernels.sampling import COUNT_MASK, PROMPT_BIT, STOP_BIT
from fastpath.runtime.runner.penalties import PenaltyFill, PenaltySlots, PenaltyTable

CPU32 = dict(device="cpu", dtype="float32", max_seq_len=128, max_batch_size=3)
PROMPTS = [list(range(3, 40)), [1, 2, 3], [9] * 20, [4, 5], [7, 8, 9, 10, 11], [30, 31] * 6]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, repetition_penalty=1.4),
    SamplingParams(max_tokens=20, temperature=0.5, top_k=40, seed=11, presence_penalty=2.0, logprobs=3),
    SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
    SamplingParams(max_tokens=20, temperature=1.2, top_p=0.8, min_p=0.05, seed=3, frequency_penalty=0.7),
    SamplingParams(temperature=0.0, max_tokens=20, min_tokens=12, stop_token_ids=[5, 6, 7, 8, 9, 10]),
    SamplingParams(max_tokens=20, temperature=0.7, seed=5, repetition_penalty=0.7, ignore_eos=True),
]


def _solo(llm, prompts=PROMPTS, params=PARAMS):
    return [token_ids(llm.generate([p], q)[0]) for p, q in zip(prompts, params, strict=True)]


def test_each_request_equals_its_solo_run_through_batching_chunking_preemption_and_slot_reuse():
    cfg = "random:tiny-llama"
    want = _solo(LLM(cfg, **{**CPU32, "max_seq_len": 64, "max_batch_size": 1}))
    # Three slots for six penalized requests (slots are reused), prefills in 16-token chunks, and a
    # cache small enough that sequences are preempted and recomputed.
    llm = LLM(cfg, **{**CPU32, "max_seq_len": 64, "max_num_batched_tokens": 16, "kv_cache_blocks": 6})
    got = [token_ids(o) for o in llm.generate(PROMPTS, PARAMS)]
    assert llm.executor.scheduler.num_preemptions > 0, "the cache is small enough to preempt"
    assert got == want
    assert all(len(t) >= 12 for t in got[4:5]), "min_tokens held the stop tokens back"


def test_greedy_rows_of_a_general_step_equal_the_greedy_fast_path_bit_for_bit():
    llm = LLM("random:tiny-llama", **CPU32)
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    fast = llm.generate(PROMPTS[:2], greedy)
    # The same batch, but a row asks for top-1 logprobs: every step runs the general sampler.
    general = llm.generate(
        PROMPTS[:2], [greedy, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)]
    )
    for a, b in zip(fast, general, strict=True):
        assert token_ids(a) == token_ids(b)
        assert chosen_logprobs(a) == chosen_logprobs(b)


@pytest.mark.slow
def test_tp2_samples_what_one_rank_samples():
    cfg = "random:tiny-llama"
    want = [token_ids(o) for o in LLM(cfg, **CPU32).generate(PROMPTS, PARAMS)]
    with LLM(cfg, tp=2, **CPU32) as llm:
        assert [token_ids(o) for o in llm.generate(PROMPTS, PARAMS)] == want


def _seq(params: SamplingParams, generated: int = 0) -> Sequence:
    seq = Sequence(0, [1, 2, 3], params, 7, frozenset({2}), 64)
    seq.output_ids = [4] * generated
    return seq


def test_only_rows_that_need_it_leave_the_greedy_fast_path():
    plain = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=0),
        SamplingParams(temperature=0.0, stop_token_ids=[3]),
    ]
    for p in plain:
        assert not needs_general(_seq(p))
    general = [
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=0.0, repetition_penalty=1.1),
        SamplingParams(temperature=0.0, presence_penalty=0.1),
        SamplingParams(temperature=0.0, frequency_penalty=-0.1),
        SamplingParams(temperature=0.0, logprobs=1),
        SamplingParams(temperature=0.0, min_tokens=3),
    ]
    for p in general:
        assert needs_general(_seq(p)), p
    assert not needs_general(_seq(SamplingParams(temperature=0.0, min_tokens=3), generated=3)), (
        "min_tokens is reached"
    )
    packed = torch.zeros(4, 6, dtype=torch.int64)
    assert decode_step([_seq(p) for p in plain], packed, 4, False, False).sampling is None
    step = decode_step([_seq(plain[0]), _seq(general[1])], packed, 4, False, False)
    assert step.sampling is not None and step.sampling.repetition.tolist() == pytest.approx(
        [1.0, 1.1, 1.0, 1.0]
    )
    assert step.top_logprobs is False


def test_large_seeds_and_top_k_and_a_vanishing_top_p_sample_sensibly():
    llm = LLM("random:tiny-llama", **CPU32)
    prompts = PROMPTS[:3]
    greedy = [
        token_ids(o)
        for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    ]
    tiny_p = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, top_p=1e-50, seed=1)
    assert [token_ids(o) for o in llm.generate(prompts, tiny_p)] == greedy, "top_p ~0 keeps the top token"
    runs = {}
    for seed in (2**63 - 1, 2**62 + 1, 0):
        p = SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, top_k=2**31 - 1, seed=seed)
        runs[seed] = [token_ids(o) for o in llm.generate(prompts, p)]
        assert runs[seed] == [token_ids(o) for o in llm.generate(prompts, p)], "seeded runs repeat"
        unbounded = SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, seed=seed)
        assert runs[seed] == [token_ids(o) for o in llm.generate(prompts, unbounded)], "top_k past V is off"
    assert len({str(v) for v in runs.values()}) == 3, "different seeds, different draws"
    derived = _seq(SamplingParams(temperature=1.0))
    derived.seed = 2**63 + 5  # e.g. seed + i for the i-th of n completions: wraps, does not overflow
    assert sampling_tensors([derived], 1).seeds.tolist() == [-(2**63) + 5]


def test_penalty_table_fill_enters_every_token_and_clears_the_slot_first():
    table = PenaltyTable(3, 40, torch.device("cpu"))

    def fill(slot, prompt, generated, stop):
        tokens = torch.tensor(prompt + generated)
        stops = torch.tensor([stop], dtype=torch.int64).view(1, len(stop))
        table.fill(
            PenaltyFill(
                torch.tensor([slot]), torch.tensor([len(prompt)]), torch.tensor([len(tokens)]), tokens, stops
            )
        )

    # A recomputed sequence in slot 2: prompt [5, 6, 5], generated [6, 9, 9], stop ids 3 and 39.
    fill(2, [5, 6, 5], [6, 9, 9], [3, 39, -1])
    e = table.entries[2]
    assert int(e[5]) == PROMPT_BIT and int(e[6]) == PROMPT_BIT | 1 and int(e[9]) == 2
    assert int(e[3]) == STOP_BIT and int(e[39]) == STOP_BIT
    assert int((e != 0).sum()) == 5 and not table.entries[0].any() and not table.entries[1].any()
    bits = [(int(table.bits[2, t >> 5]) >> (t & 31)) & 1 for t in range(40)]
    assert bits == [int(x != 0) for x in e.tolist()]
    # Another sequence's fill leaves slot 2 alone; slot 2's next owner finds it cleared.
    fill(1, [7], [], [])
    assert int(table.entries[1, 7]) == PROMPT_BIT and int(table.entries[2, 9] & COUNT_MASK) == 2
    fill(2, [8], [], [])
    assert table.entries[2].nonzero().flatten().tolist() == [8] and int(table.bits[2].count_nonzero()) == 1


def test_slots_are_reused_once_their_sequence_is_released():
    slots = PenaltySlots(2)
    a, b, c = (_seq(SamplingParams(temperature=0.0, repetition_penalty=1.2)) for _ in range(3))
    for i, s in enumerate((a, b, c)):
        s.seq_id = i
    assert {slots.assign(a), slots.assign(b)} == {1, 2}
    assert slots.assign(a) == slots.slot_of(a), "a recompute keeps its slot"
    with pytest.raises(RuntimeError, match="penalty table full"):
        slots.assign(c)
    a.table_epoch += 1  # the scheduler released a (finished, aborted or preempted)
    got = slots.assign(c)
    assert got == 1 or got == 2
    assert slots.slot_of(a) == 0 and slots.slot_of(c) == got
    slots.release(b)
    assert slots.slot_of(b) == 0 and slots.assign(a) not in (0, got)


def test_a_steps_general_flag_is_any_rows_needs_general():
    """The per-step shortcut (decided once per SamplingParams) agrees with the per-row definition."""
    import itertools

    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0.0, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=0.0, logprobs=0),
        SamplingParams(temperature=0.0, min_tokens=3),
    ]
    seqs = [_seq(p, generated=g) for p in kinds for g in (0, 3)]
    for k in (1, 2, 3):
        for combo in itertools.combinations(seqs, k):
            assert any_needs_general(list(combo)) == any(needs_general(s) for s in combo)


def test_a_cached_sampling_row_follows_the_counter_and_the_slot():
    """A sequence packs its sampling fields once; each step patches the counter, and a new penalty
    slot (after preemption frees the old one) repacks them."""
    slots = PenaltySlots(2)
    a, b = (
        _seq(SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.2, min_tokens=3)) for _ in range(2)
    )
    a.seq_id, b.seq_id = 0, 1
    first = slots.assign(a)
    p = sampling_tensors([a], 2, slots)
    assert (
        p.slots.tolist() == [first, 0] and p.counters.tolist() == [0, 0] and p.min_tokens.tolist() == [3, 0]
    )
    a.output_ids += [4, 4]
    a.num_pending = 1
    p = sampling_tensors([a], 1, slots)
    assert p.counters.tolist() == [3] and p.slots.tolist() == [first]
    assert p.top_k.tolist() == [5] and abs(p.temperature.item() - 0.7) < 1e-6
    a.table_epoch += 1  # preempted: its slot is released, and b takes one first
    slots.assign(b)
    second = slots.assign(a)
    assert sampling_tensors([a, b], 2, slots).slots.tolist() == [second, slots.slot_of(b)]
    slots.release(a)
    assert sampling_tensors([a], 1, slots).slots.tolist() == [0], "a released sequence has no slot"


def test_kept_sampling_rows_equal_a_fresh_pack_through_steps_batch_changes_and_slot_moves():
    """The executor keeps a steady batch's packed rows and rewrites only the counters; whatever the
    steps do to the batch and the penalty slots, each step's rows are what a fresh pack gives, and a
    step's tensor is not the one the step before it is still copying from."""
    slots = PenaltySlots(3)
    seqs = [_seq(PARAMS[i]) for i in (0, 1, 3, 5)]
    for i, s in enumerate(seqs):
        s.seq_id = i
    for s in seqs[:3]:
        slots.assign(s)
    kept, last = SamplingRows(pinned=False), None

    def check(batch: list, rows: int) -> None:
        nonlocal last
        got = kept.tensors(batch, rows, slots).data
        assert torch.equal(got, sampling_tensors(batch, rows, slots).data)
        assert last is None or got.data_ptr() != last.data_ptr(), "two buffers in turn"
        last = got

    batch = seqs[:3]
    for _ in range(3):  # steady: only the counters move
        check(batch, 4)
        for s in batch:
            s.output_ids.append(9)
        batch[0].num_pending = 1
    check(list(batch), 4)  # an equal list, not the same one
    check(batch, 8)  # another graph size
    batch = [seqs[0], seqs[2], seqs[1]]  # rows moved
    check(batch, 4)
    slots.release(seqs[1])  # its slot goes to the fourth, in the same rows
    slots.assign(seqs[3])
    check(batch, 4)
    check(seqs, 4)
