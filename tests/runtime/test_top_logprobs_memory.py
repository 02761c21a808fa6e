"""Top-k logprobs are kept as tuples of numbers: one pair per token of every sequence that asks, for
the whole request, where lists would be traversed by every full collection of the cyclic collector
(at batch 256 with logprobs=5 that tripled the host's time per step as a run went on)."""

from __future__ import annotations

import gc

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.sequence import Sequence


def test_each_tokens_top_logprobs_are_untracked_tuples(monkeypatch):
    from fastpath.runtime.engine.executor import ExecutorCore

    seqs: dict[int, Sequence] = {}
    complete = ExecutorCore.complete

    def spy(self, step):  # both ways a step's tokens reach its sequences pass here
        seqs.update((s.seq_id, s) for s in step.sampled)
        return complete(self, step)

    monkeypatch.setattr(ExecutorCore, "complete", spy)
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    out = llm.generate([[5, 6, 7], [8, 9]], params, use_tqdm=False)
    assert all(len(o.outputs[0].logprobs) == 6 for o in out)
    kept = [top for s in seqs.values() for top in s.top_logprobs]
    assert len(kept) == 12
    gc.collect()
    for ids, lps in kept:
        assert type(ids) is tuple and type(lps) is tuple and len(ids) == len(lps) == 3
        assert not gc.is_tracked(ids) and not gc.is_tracked(lps)


def test_a_step_converts_only_the_top_logprob_columns_some_row_asked_for(monkeypatch):
    from fastpath.runtime.engine.executor import ExecutorCore

    widths = []
    read_back = ExecutorCore._read_back

    def spy(self, batch, sampled, out):
        step = read_back(self, batch, sampled, out)
        if step.host.top_ids is not None:
            widths.append(step.top_k)
        return step

    monkeypatch.setattr(ExecutorCore, "_read_back", spy)
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=64)
    asks = [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=k) for k in (2, 4)]
    out = llm.generate([[5, 6, 7], [8, 9]], asks, use_tqdm=False)
    assert [len(o.outputs[0].logprobs[-1]) for o in out] == [2, 4]
    assert widths and set(widths) == {4}
    none = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0)
    widths.clear()
    llm.generate([[5, 6, 7]], none, use_tqdm=False)
    assert widths == [], "logprobs=0 asks for the chosen token's only"
