"""One LLM serves many callers: threads and streams share one continuous batch, each gets its own outputs."""

import threading
import time

import pytest

from fastpath.runtime import LLM, SamplingParams

PROMPTS = [[5 + i, 17, 9 + 2 * i, 40 - i] for i in range(10)]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
    SamplingParams(max_tokens=9, ignore_eos=True, temperature=0.8, seed=11),
    SamplingParams(max_tokens=4, ignore_eos=True, temperature=1.0, top_k=20, seed=3),
]
BOUND_S = 120


@pytest.fixture(scope="module")
def llm():
    engine = LLM("random:tiny-llama", device="cpu", max_seq_len=64, max_batch_size=16)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def solo(llm):
    """Every (prompt, params) pair run alone: what each caller must get back, whatever else runs."""
    return {
        (i, j): llm.generate([p], PARAMS[j])[0].outputs[0].token_ids
        for i, p in enumerate(PROMPTS)
        for j in range(len(PARAMS))
    }


def test_eight_threads_and_streams_each_get_their_solo_outputs(llm, solo):
    failures: list[str] = []
    deadline = time.monotonic() + BOUND_S

    def caller(t: int) -> None:
        for r in range(50):
            if time.monotonic() > deadline:
                failures.append(f"thread {t} ran out of time at request {r}")
                return
            i, j = (t * 7 + r) % len(PROMPTS), (t + r) % len(PARAMS)
            if r % 10 == 3:  # a stream every so often, interleaved with the others' generate calls
                ids = [tok for d in llm.stream([PROMPTS[i]], PARAMS[j]) for tok in d.outputs[0].token_ids]
            else:
                ids = llm.generate([PROMPTS[i]], PARAMS[j], use_tqdm=False)[0].outputs[0].token_ids
            if ids != solo[(i, j)]:
                failures.append(f"thread {t} request {r}: {ids} != {solo[(i, j)]}")

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()) + 5)
    assert not any(th.is_alive() for th in threads), "a caller hung"
    assert failures == []
    stats = llm.stats()
    assert stats.running == stats.waiting == 0 and stats.kv_blocks_free == stats.kv_blocks_total


def test_generate_while_a_stream_is_suspended(llm, solo):
    stream = llm.stream([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    first = next(stream)
    # The stream's request keeps running while this caller, and then another thread, generate.
    assert llm.generate([PROMPTS[1]], PARAMS[0])[0].outputs[0].token_ids == solo[(1, 0)]
    other: list = []
    th = threading.Thread(target=lambda: other.append(llm.generate([PROMPTS[2]], PARAMS[1])))
    th.start()
    th.join(BOUND_S)
    assert other[0][0].outputs[0].token_ids == solo[(2, 1)]
    rest = [tok for d in stream for tok in d.outputs[0].token_ids]
    alone = (
        llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[0]
        .outputs[0]
        .token_ids
    )
    assert first.outputs[0].token_ids + rest == alone


def test_an_asyncio_caller_shares_the_batch(llm, solo):
    import asyncio

    async def one(i: int, j: int) -> list[int]:
        handle = llm.submit(PROMPTS[i], PARAMS[j], loop=asyncio.get_running_loop())
        return [tok async for d in handle for tok in d.outputs[0].token_ids]

    async def main():
        return await asyncio.gather(*(one(i, i % 3) for i in range(len(PROMPTS))))

    got = asyncio.run(main())
    assert got == [solo[(i, i % 3)] for i in range(len(PROMPTS))]


def test_an_engine_nobody_holds_is_closed_and_its_loop_thread_ends():
    import gc
    import weakref

    engine = LLM("random:tiny-llama", device="cpu", max_seq_len=64)
    engine.generate([PROMPTS[0]], PARAMS[0])
    loop = engine.core._thread
    ref = weakref.ref(engine)
    del engine
    gc.collect()
    assert ref() is None, "nothing (the loop thread included) keeps an unreferenced engine alive"
    loop.join(10)
    assert not loop.is_alive()


def test_an_aborted_request_leaves_nothing_behind_in_the_engine():
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=256, max_batch_size=4)
    try:
        handles = [
            llm.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
            for _ in range(3)
        ]
        for h in handles:
            h.abort()
        for h in handles:
            assert h.result(timeout=60).outputs[0].finish_reason == "abort"
        assert not llm.core._live, "an aborted handle is still tracked as live"
        stats = llm.stats()
        assert (stats.running, stats.waiting, stats.kv_blocks_free) == (0, 0, stats.kv_blocks_total)
    finally:
        llm.close()
