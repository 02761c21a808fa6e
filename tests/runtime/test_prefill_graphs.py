"""Prefill graphs on the CPU: the buckets, the static layout a replay reads, and the switch.

The capture and replay themselves need CUDA (test_gpu_runtime.py); the kernel over padded buffers
runs under the Triton interpreter (triton_interpreter_checks.py).
"""

import numpy as np
import pytest
import torch

from fastpath.runtime import LLM
from fastpath.runtime.attention.triton_prefill import BLOCK_M, tile_map
from fastpath.runtime.runner.prefill_graphs import TOKEN_BUCKETS, PrefillLayout, token_buckets
from fastpath.runtime.runner.step_inputs import PrefillStep


def test_buckets_cover_the_step_budget_and_stop_at_the_largest():
    assert token_buckets(2048) == tuple(t for t in TOKEN_BUCKETS if t <= 2048)
    assert token_buckets(2048)[-1] == 2048
    assert token_buckets(1000)[-1] == 1000 and all(t < 1000 for t in token_buckets(1000)[:-1])
    assert token_buckets(100) == (100,)
    assert token_buckets(1 << 20) == TOKEN_BUCKETS  # longer steps run eagerly
    assert token_buckets(TOKEN_BUCKETS[-1]) == TOKEN_BUCKETS


def test_padding_is_bounded_by_a_tile_or_a_quarter_of_the_step():
    assert list(TOKEN_BUCKETS) == sorted(set(TOKEN_BUCKETS))
    assert all(t % BLOCK_M == 0 for t in TOKEN_BUCKETS)  # whole query tiles
    for n in range(TOKEN_BUCKETS[0], TOKEN_BUCKETS[-1] + 1):
        padded = next(t for t in TOKEN_BUCKETS if t >= n)
        assert padded - n < max(BLOCK_M, n / 4), n


def step(qlens: list[int], ctxs: list[int], width: int, sampled: list[int]) -> PrefillStep:
    n = sum(qlens)
    g = torch.Generator().manual_seed(len(qlens))
    return PrefillStep(
        ids=torch.randint(1, 1000, (n,), generator=g),
        positions=torch.randint(0, 500, (n,), generator=g),
        slots=torch.randint(1, 5000, (n,), generator=g),
        tables=torch.randint(1, 300, (len(qlens), width), generator=g),
        ends=torch.tensor(ctxs),
        query_lens=torch.tensor(qlens),
        logits_rows=torch.tensor(sampled),
        sampling=None,
    )


def test_a_staged_step_is_its_payload_then_inert_padding():
    layout = PrefillLayout(tokens=256, seqs=8, width=6)
    s = step([70, 1, 129], [70, 41, 300], width=4, sampled=[69, 70])
    host64 = torch.full((layout.words64,), -5, dtype=torch.int64)  # a previous step's leftovers
    host32 = torch.full((layout.words32,), -5, dtype=torch.int32)
    layout.stage(s, host64, host32)
    ids, positions, slots, rows = layout.views64(host64)
    for got, want in ((ids, s.ids), (positions, s.positions), (slots, s.slots)):
        assert torch.equal(got[:200], want) and not got[200:].any()  # padding writes the null slot 0
    assert rows.tolist() == [69, 70, 0, 0, 0, 0, 0, 0]
    tables, ends, tiles = layout.views32(host32)
    assert tables.shape == (9, 6) and torch.equal(tables[:3, :4], s.tables.int())
    assert ends.tolist() == [70, 41, 300, 0, 0, 0, 0, 0, 0]  # row 8 is the empty padding sequence
    tiles = tiles.view(-1, 4)
    live = torch.tensor(tile_map([70, 1, 129], BLOCK_M), dtype=torch.int32).view(-1, 4)
    assert tiles.shape[0] == layout.tiles == 256 // BLOCK_M + 8
    assert torch.equal(tiles[: len(live)], live)
    assert (tiles[len(live) :] == torch.tensor([8, 0, 0, 0], dtype=torch.int32)).all()


def test_the_largest_step_a_bucket_holds_takes_every_tile_it_has():
    # Every sequence one token past a tile boundary: the most tiles T tokens of S sequences need.
    layout = PrefillLayout(tokens=4 * BLOCK_M + 4, seqs=4, width=2)
    s = step([BLOCK_M + 1] * 4, [BLOCK_M + 1] * 4, width=2, sampled=[0])
    host64 = torch.zeros(layout.words64, dtype=torch.int64)
    host32 = torch.zeros(layout.words32, dtype=torch.int32)
    layout.stage(s, host64, host32)
    assert len(tile_map([BLOCK_M + 1] * 4, BLOCK_M)) // 4 == 8 <= layout.tiles
    assert np.array_equal(layout.views32(host32)[2].view(-1, 4)[:8, 3].numpy(), [BLOCK_M + 1] * 8)


@pytest.mark.parametrize(
    "tokens,seqs,width,fits",
    [
        ((200, 3, 4), 3, 4, True),
        ((257, 3, 4), 3, 4, False),
        ((200, 9, 4), 9, 4, False),
        ((200, 3, 7), 3, 7, False),
    ],
)
def test_a_step_fits_a_bucket_only_within_all_its_sizes(tokens, seqs, width, fits):
    n, s, w = tokens
    qlens = [n - (s - 1)] + [1] * (s - 1)
    layout = PrefillLayout(tokens=256, seqs=8, width=6)
    assert layout.fits(step(qlens, qlens, width=w, sampled=list(range(min(s, 8))))) is fits


def test_prefill_graphs_are_off_on_the_cpu_and_refused_when_asked_for():
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=64)
    try:
        assert llm.executor.runner.prefill_graphs is None
    finally:
        llm.close()
    with pytest.raises(ValueError) as err:
        LLM("random:tiny-llama", device="cpu", prefill_graphs=True)
    assert str(err.value) == "prefill_graphs=True cannot be honoured: the device is not CUDA"
    with pytest.raises(ValueError, match="prefill_graphs must be True, False or None"):
        LLM("random:tiny-llama", device="cpu", prefill_graphs="on")
