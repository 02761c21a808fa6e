"""Staging a decode step: what the packed buffer holds, and that cached block-table rows never go stale."""

import torch

from fastpath.runtime.engine.sampling_params import SamplingParams
from fastpath.runtime.engine.sequence import Sequence
from fastpath.runtime.engine.steps import stage
from fastpath.runtime.runner.decode_inputs import CONTEXT_LEN, FIXED_COLUMNS, POSITION, SLOT, SRC_ROW, TOKEN


def _seq(i, blocks, pending=0, prompt_len=20):
    s = Sequence(i, list(range(10, 10 + prompt_len)), SamplingParams(temperature=0.0), 0, frozenset(), 512)
    s.block_table = list(blocks)
    s.num_pending = pending
    return s


def test_rows_hold_token_position_slot_and_table_and_padding_writes_the_null_slot():
    a, b = _seq(0, [7, 9]), _seq(1, [3, 4], pending=1)
    packed = torch.full((3, FIXED_COLUMNS + 4), 99, dtype=torch.int64)
    stage(packed, [a, b], {1: 5}, 16)
    assert packed[0, :FIXED_COLUMNS].tolist() == [29, -1, 19, 9 * 16 + 3, 20]
    assert packed[1, [TOKEN, SRC_ROW, POSITION]].tolist() == [-1, 5, 20]
    assert packed[1, SLOT] == 4 * 16 + 4 and packed[1, CONTEXT_LEN] == 21
    assert packed[0, FIXED_COLUMNS : FIXED_COLUMNS + 2].tolist() == [7, 9]
    assert packed[2].tolist() == [0, -1, 0, 0, 1, 0, 0, 0, 0]


def test_cached_tables_are_rewritten_when_they_grow_move_or_are_reallocated():
    owners = [(-1, 0, 0)] * 2
    packed = torch.zeros(2, FIXED_COLUMNS + 4, dtype=torch.int64)
    a, b = _seq(0, [7], prompt_len=5), _seq(1, [3], prompt_len=5)
    stage(packed, [a, b], {}, 16, owners)
    a.block_table.append(8)  # grew
    stage(packed, [a, b], {}, 16, owners)
    assert packed[0, FIXED_COLUMNS : FIXED_COLUMNS + 2].tolist() == [7, 8]
    stage(packed, [b, a], {}, 16, owners)  # rows swapped
    assert packed[0, FIXED_COLUMNS] == 3 and packed[1, FIXED_COLUMNS : FIXED_COLUMNS + 2].tolist() == [7, 8]
    b.block_table, b.table_epoch = [11], b.table_epoch + 1  # preempted and recomputed: same length, new block
    stage(packed, [b, a], {}, 16, owners)
    assert packed[0, FIXED_COLUMNS] == 11
    stage(packed, [a], {}, 16, owners)  # b left: its row becomes padding
    assert packed[1].tolist() == [0, -1, 0, 0, 1, 0, 0, 0, 0]


def test_a_steady_batch_stages_by_vector_ops_exactly_as_a_full_pass_would(monkeypatch):
    """Scheduler.continue_decode's fast path hands the same batch on, and the executor stages it from
    the last step's buffer (steps.stage_steady). Every such step is checked against stage() over the
    same sequences, through block boundaries (16 tokens), different lengths and finishes; then the
    tokens equal those of the same requests through full passes only."""
    from fastpath.runtime import LLM
    from fastpath.runtime.engine import executor as executor_module
    from fastpath.runtime.engine import steps
    from fastpath.runtime.engine.scheduler import Scheduler

    checked = []
    real_stage, real_continue = steps.stage_steady, Scheduler.continue_decode

    def checked_stage_steady(packed, last, seqs, block_size, owners):
        real_stage(packed, last, seqs, block_size, owners)
        full = torch.zeros_like(packed)
        stage(full, seqs, {s.seq_id: i for i, s in enumerate(seqs)}, block_size)
        assert torch.equal(packed[:, :FIXED_COLUMNS], full[:, :FIXED_COLUMNS])
        for r, s in enumerate(seqs):  # each table's live blocks; entries past them are never read
            k = min(len(s.block_table), packed.shape[1] - FIXED_COLUMNS)
            assert packed[r, FIXED_COLUMNS : FIXED_COLUMNS + k].tolist() == s.block_table[:k]
        checked.append(len(seqs))

    def never_steady(self, prev):
        prev.horizon = 0
        batch = real_continue(self, prev)
        if batch is not None:
            batch.seqs = list(batch.seqs)  # a new list: the executor stages it in full
        return batch

    prompts = [[5 + i] * (3 + 7 * i) for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=20 + 9 * i, ignore_eos=True) for i in range(4)]
    # Rows that keep logprobs, and a row a token stops.
    params.append(SamplingParams(temperature=0.8, seed=3, max_tokens=60, logprobs=2, ignore_eos=True))
    with LLM("random:tiny-llama", device="cpu", max_seq_len=256, max_batch_size=8) as llm:
        plain = llm.generate(prompts[5:], SamplingParams(temperature=0.0, max_tokens=40), use_tqdm=False)
        ids = plain[0].outputs[0].token_ids
        at = next(i for i in range(14, len(ids)) if ids[i] not in ids[:i])  # first seen mid-batch
        stop = ids[at]
        params.append(SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop], logprobs=0))
        steady = []
        real_accept = executor_module.ExecutorCore._accept_steady

        def counted_accept(self, step, record, *rest):
            took = real_accept(self, step, record, *rest)
            steady.append(took)
            return took

        monkeypatch.setattr(executor_module, "stage_steady", checked_stage_steady)
        monkeypatch.setattr(executor_module.ExecutorCore, "_accept_steady", counted_accept)
        fast = llm.generate(prompts, params, use_tqdm=False)
        monkeypatch.setattr(Scheduler, "continue_decode", never_steady)
        monkeypatch.setattr(executor_module, "stage_steady", None)  # a use of it would fail now
        full = llm.generate(prompts, params, use_tqdm=False)
    assert len(checked) > 20 and min(checked) < max(checked)
    assert steady.count(True) > 20

    def shown(outs):
        return [(c.token_ids, c.logprobs, c.finish_reason, c.stop_reason) for o in outs for c in o.outputs]

    assert shown(fast) == shown(full)
    assert fast[5].outputs[0].stop_reason == stop and len(fast[5].outputs[0].token_ids) == at + 1


def test_a_steady_step_with_a_token_that_could_stop_a_row_takes_every_rows_path():
    from types import SimpleNamespace

    import numpy as np

    from fastpath.runtime.engine.executor import ExecutorCore
    from fastpath.runtime.engine.steps import StepRecord
    from fastpath.runtime.runner.sampler import Sampled

    a = _seq(0, [1, 2])
    b = Sequence(
        1, [3, 4], SamplingParams(temperature=0.0, stop_token_ids=[42], logprobs=0), 0, frozenset({2}), 64
    )
    c = Sequence(2, [3, 4], SamplingParams(temperature=0.0, ignore_eos=True), 0, frozenset({7}), 64)
    for s in (a, b, c):
        s.num_pending = 1
    core = SimpleNamespace(_steady_of=(None, np.empty(0), []))

    def step(tokens):
        host = Sampled(torch.tensor(tokens), torch.tensor([-0.5, -0.25, -0.125]))
        return SimpleNamespace(sampled=[a, b, c], host=host)

    record = StepRecord("decode", 3)
    assert ExecutorCore._accept_steady(core, step([5, 6, 7]), record, None)  # 7: EOS, but c ignores it
    assert [s.output_ids for s in (a, b, c)] == [[5], [6], [7]] and b.logprobs == [-0.25]
    assert [t for _, t in record.new_tokens] == [5, 6, 7] and not any(s.num_pending for s in (a, b, c))
    for s in (a, b, c):
        s.num_pending = 1
    for stop in ([42, 6, 7], [5, 2, 7]):  # b's stop id, then b's EOS
        assert not ExecutorCore._accept_steady(core, step(stop), StepRecord("decode", 3), None)
    assert [s.output_ids for s in (a, b, c)] == [[5], [6], [7]], "a refused step leaves every row as it was"


def test_a_batchs_traits_are_decided_once_per_list_and_min_tokens_still_counts_each_step():
    from fastpath.runtime.engine.steps import BatchTraits, any_needs_general, wants_top_logprobs

    def seq(i, **kw):
        return Sequence(i, [1, 2], SamplingParams(**{"temperature": 0.0, **kw}), 0, frozenset({2}), 64)

    traits = BatchTraits()
    plain, waiting = seq(0), seq(1, min_tokens=3)
    batch = [plain, waiting]
    for generated in range(5):
        waiting.output_ids = [9] * generated
        assert (
            traits.of(batch)
            == (any_needs_general(batch), wants_top_logprobs(batch))
            == (generated < 3, False)
        )
    hot = [plain, seq(2, temperature=0.7, logprobs=2)]
    assert traits.of(hot) == (True, True)  # a new list is decided anew
    assert traits.of(batch) == (False, False)
