"""Random workloads on a cache too small for all of them at once: chunked prompts, preemption,
admission beside the step in flight, n > 1, stops, penalties, biases and a prefix cache change when
work happens, never a request's tokens. Each request's tokens are those it gets alone on a roomy
engine."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastpath.runtime import LLM, SamplingParams

MODEL = "random:tiny-qwen2"


# Prompt heads that several requests of a workload share, for the prefix cache to find.
HEADS = [list(range(100, 133)), [7, 8, 9] * 12, []]


@st.composite
def requests(draw):
    out = []
    for _ in range(draw(st.integers(3, 9))):
        head = draw(st.sampled_from(HEADS))
        prompt = head + draw(st.lists(st.integers(3, 499), min_size=1, max_size=60 - len(head)))
        kind = draw(st.sampled_from(["greedy", "seeded", "penalized", "biased"]))
        kw = {"max_tokens": draw(st.integers(1, 16)), "ignore_eos": draw(st.booleans())}
        if kind == "greedy":
            kw["temperature"] = 0.0
        elif kind == "seeded":
            kw |= {"temperature": 0.9, "seed": draw(st.integers(0, 99)), "n": draw(st.integers(1, 3))}
        elif kind == "penalized":
            kw |= {"temperature": 0.0, "repetition_penalty": 1.2, "frequency_penalty": 0.3}
        else:
            bias = draw(st.dictionaries(st.integers(3, 499), st.floats(-100, 100), min_size=1, max_size=5))
            kw |= {"temperature": 0.0, "logit_bias": bias}
        if draw(st.booleans()):
            kw["stop_token_ids"] = draw(st.lists(st.integers(3, 499), max_size=30))
        out.append((prompt, SamplingParams(**kw)))
    return out


@pytest.fixture(scope="module")
def roomy():
    return LLM(MODEL, device="cpu", max_seq_len=80, max_batch_size=1)


@pytest.fixture(scope="module")
def tight():
    # 5 blocks of 16 tokens for up to 4 sequences of up to 76: preemption and partial prompts.
    return LLM(MODEL, device="cpu", max_seq_len=80, max_batch_size=4, max_num_batched_tokens=24,
               kv_cache_blocks=6, mixed_batches=True)  # fmt: skip


@pytest.fixture(scope="module")
def tight_cached():
    return LLM(MODEL, device="cpu", max_seq_len=80, max_batch_size=4, max_num_batched_tokens=24,
               kv_cache_blocks=6, mixed_batches=True, enable_prefix_caching=True)  # fmt: skip


def _tokens(outs):
    return [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outs]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(work=requests())
def test_a_crowded_cache_gives_every_request_its_solo_tokens(roomy, tight, work):
    _crowded(roomy, tight, work)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(work=requests())
def test_a_crowded_prefix_cache_gives_every_request_its_solo_tokens(roomy, tight_cached, work):
    _crowded(roomy, tight_cached, work)
    cache = tight_cached.executor.allocator
    assert not any(cache._refs), "every block's references were given back"
    assert cache.num_remembered <= len(cache._idle), "a remembered block nobody holds is idle"


def _crowded(roomy, tight, work):
    prompts, params = [p for p, _ in work], [s for _, s in work]
    solo = [_tokens(roomy.generate([p], s, use_tqdm=False))[0] for p, s in work]
    assert _tokens(tight.generate(prompts, params, use_tqdm=False)) == solo
    stats = tight.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total and stats.running == stats.waiting == 0
