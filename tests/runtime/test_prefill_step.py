"""A prefill step's host payload equals its per-token definition, for any mix of prompt chunks and
one-token decode rows (the payload is built with numpy, the definition token by token)."""

import random

import pytest
import torch

from fastpath.runtime import SamplingParams
from fastpath.runtime.engine.scheduler import ScheduledBatch
from fastpath.runtime.engine.sequence import Sequence
from fastpath.runtime.engine.steps import prefill_step

BS = 16


def _definition(batch: ScheduledBatch) -> dict[str, list]:
    ids, positions, slots, logits_rows, offset = [], [], [], [], 0
    for seq, start, n, samples in zip(batch.seqs, batch.starts, batch.lens, batch.samples, strict=True):
        tokens = seq.prompt_ids + seq.output_ids
        for i in range(start, start + n):
            ids.append(tokens[i])
            positions.append(i)
            slots.append(seq.block_table[i // BS] * BS + i % BS)
        offset += n
        if samples:
            logits_rows.append(offset - 1)
    ends = [s + n for s, n in zip(batch.starts, batch.lens, strict=True)]
    width = max(-(-e // BS) for e in ends)
    tables = [(s.block_table[:width] + [0] * width)[:width] for s in batch.seqs]
    return {"ids": ids, "positions": positions, "slots": slots, "tables": tables, "ends": ends,
            "query_lens": list(batch.lens), "logits_rows": logits_rows}  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_a_prefill_payload_is_its_per_token_definition(seed):
    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=64)
    seqs, starts, lens, samples = [], [], [], []
    blocks = iter(rng.sample(range(1, 5000), 4000))
    for k in range(rng.randint(1, 9)):
        prompt = [rng.randrange(1000) for _ in range(rng.randint(1, 70))]
        seq = Sequence(k, prompt, params, 0, frozenset(), 512)
        seq.output_ids = [rng.randrange(1000) for _ in range(rng.choice([0, 0, rng.randint(1, 30)]))]
        total = len(prompt) + len(seq.output_ids)
        if seq.output_ids and rng.random() < 0.5:
            start, n = total - 1, 1  # a decode riding along
        else:
            start = rng.randrange(total)
            n = rng.randint(1, total - start)  # a chunk, which may cross into the outputs (a recompute)
        seq.block_table = [next(blocks) for _ in range(-(-(start + n) // BS) + rng.randint(0, 2))]
        seqs.append(seq)
        starts.append(start)
        lens.append(n)
        samples.append(start + n == total)
    batch = ScheduledBatch("prefill", seqs, starts, lens, samples)
    want = _definition(batch)
    step, sampled = prefill_step(batch, BS)
    for name, value in want.items():
        got = getattr(step, name)
        assert got.dtype == torch.int64, name
        assert got.tolist() == value, name
    assert sampled == [s for s, keep in zip(seqs, samples, strict=True) if keep]
    assert [s.num_computed for s in seqs] == [a + n for a, n in zip(starts, lens, strict=True)]
