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
        return real_continue(self, prev)

    prompts = [[5 + i] * (3 + 7 * i) for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=20 + 9 * i, ignore_eos=True) for i in range(6)]
    with LLM("random:tiny-llama", device="cpu", max_seq_len=256, max_batch_size=8) as llm:
        monkeypatch.setattr(executor_module, "stage_steady", checked_stage_steady)
        fast = llm.generate(prompts, params, use_tqdm=False)
        monkeypatch.setattr(Scheduler, "continue_decode", never_steady)
        monkeypatch.setattr(executor_module, "stage_steady", None)  # a use of it would fail now
        full = llm.generate(prompts, params, use_tqdm=False)
    assert len(checked) > 20 and min(checked) < max(checked)
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in full]
