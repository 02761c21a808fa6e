"""Automatic prefix caching: blocks found again by their tokens, shared while held, kept while idle,
evicted tail first; and an engine that prefills only what its cache lacks, with the same tokens."""

import pytest
from test_sampling_controls import token_ids

from fastpath.runtime import LLM, RequestError, SamplingParams
from fastpath.runtime.engine.options import parse_options
from fastpath.runtime.runner.prefix_cache import PrefixCachingAllocator, Walk

BS = 4


def _prefilled(cache, tokens):
    """A sequence's blocks for `tokens`, taken and remembered as the scheduler does."""
    hit = cache.match(tokens, (len(tokens) - 1) // BS)
    table = hit + cache.allocate(-(-len(tokens) // BS) - len(hit))
    cache.remember(table, tokens, len(tokens) // BS, Walk())
    return hit, table


def test_a_prompt_finds_the_whole_blocks_an_earlier_one_left_and_shares_them():
    cache = PrefixCachingAllocator(16, BS)
    first = list(range(10))  # blocks [0..3], [4..7], and two tokens
    _, table = _prefilled(cache, first)
    assert cache.num_remembered == 2
    hit, other = _prefilled(cache, [*first[:8], 99, 98, 97])
    assert hit == table[:2] and other[:2] == table[:2], "the shared prefix's blocks, held by both"
    assert cache.match([0, 1, 2, 3, 4, 5, 6, 99, 8], 2) == table[:1], "a block matches only whole"
    cache.free(table[:1])
    assert cache.match([5, 1, 2, 3], 1) == [], "the first block differs: nothing"


def test_released_blocks_stay_findable_until_an_allocation_needs_them_tail_first():
    cache = PrefixCachingAllocator(6, BS)  # blocks 1..5
    tokens = list(range(12))
    _, table = _prefilled(cache, [*tokens, 0])  # three full blocks and one more
    cache.free(table)
    assert cache.num_free == 5 and cache.num_remembered == 3, "idle blocks count as free"
    assert len(cache.allocate(3)) == 3, "the two free blocks, then one idle one"
    # The tail went first: the first two blocks still serve the prefix, the third is forgotten.
    assert cache.num_remembered == 2
    assert cache.match([*tokens, 0], 3) == table[:2]


def test_a_reused_predecessor_makes_its_successors_keys_stale():
    """A block handed out again and remembered for other tokens is not the predecessor its old
    successors were computed after: they must not be found through it."""
    cache = PrefixCachingAllocator(4, BS)  # blocks 1..3
    a = [*range(8), 0]
    _, table = _prefilled(cache, a)
    cache.free(table)
    head, second = table[:2]
    cache._idle.move_to_end(head, last=False)  # evicted before its successor
    cache.allocate(1)  # the free block first
    b_head = cache.allocate(1)
    assert b_head == [head], "b's first block is a's evicted head"
    b = [50, 51, 52, 53, *a[4:8], 9]  # a's second block's tokens after another first block
    cache.remember(b_head, b, 1, Walk())
    assert cache.match(b, 2) == [head], "a's second block does not follow b's head"
    assert second in cache._idle, "it stays, under a key nothing reaches, until evicted"


def test_a_reset_forgets_every_block_and_frees_the_idle_ones():
    cache = PrefixCachingAllocator(8, BS)
    tokens = [*range(12), 0]
    _, held = _prefilled(cache, tokens)
    _, released = _prefilled(cache, [*range(100, 108), 0])
    cache.free(released)
    assert cache.num_remembered == 5 and len(cache._idle) == 2
    assert cache.reset() == 5
    assert cache.num_remembered == 0 and not cache._idle and cache.num_free == 7 - len(held)
    assert cache.match(tokens, 3) == [], "held blocks stay with their sequence, never found again"
    cache.free(held)
    assert cache.num_free == 7


def test_two_sequences_that_computed_the_same_prefix_chain_from_the_first_remembered():
    cache = PrefixCachingAllocator(16, BS)
    tokens = list(range(9))
    _, _a = _prefilled(cache, tokens)
    b = cache.allocate(3)  # computed in the same step, before the first was remembered
    walk = cache.remember(b, tokens, 2, Walk())
    assert walk.blocks == 2 and cache.num_remembered == 2, "b's blocks are not remembered twice"
    cache.free(b)
    assert cache.num_free == 16 - 1 - 3, "b's blocks went back to the free list"


CPU32 = dict(device="cpu", dtype="float32", max_seq_len=128, max_batch_size=4)
SYSTEM = list(range(5, 60))
PROMPTS = [[*SYSTEM, 1, 2, 3], [*SYSTEM, 7, 8], SYSTEM + [9] * 10, [3, 4, 5]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def plain():
    return LLM("random:tiny-llama", **CPU32)


def test_prompts_that_share_a_prefix_prefill_only_the_rest_and_get_the_same_tokens(plain):
    want = [token_ids(o) for o in plain.generate(PROMPTS, GREEDY)]
    llm = LLM("random:tiny-llama", enable_prefix_caching=True, **CPU32)
    first = llm.generate(PROMPTS[:1], GREEDY)
    assert [token_ids(o) for o in first] == want[:1] and first[0].num_cached_tokens == 0
    stats = llm.stats()
    assert stats.prefix_cache_hits == 0 and stats.prefix_cache_queries == len(PROMPTS[0])
    before = llm.stats().step_tokens["prefill"]
    outs = llm.generate(PROMPTS, GREEDY)
    assert [token_ids(o) for o in outs] == want
    cached = (len(SYSTEM) // 16) * 16  # whole 16-token blocks of the shared system prompt
    assert [o.num_cached_tokens for o in outs] == [cached] * 3 + [0]
    stats = llm.stats()
    assert stats.prefix_cache_hits == 3 * cached, "PROMPTS[0] again, and the two that share its head"
    assert stats.step_tokens["prefill"] - before == sum(map(len, PROMPTS)) - stats.prefix_cache_hits


def test_a_conversations_next_turn_finds_the_last_turns_prompt_and_reply(plain):
    llm = LLM("random:tiny-llama", enable_prefix_caching=True, **CPU32)
    reply = token_ids(llm.generate(PROMPTS[:1], GREEDY)[0])
    turn = PROMPTS[0] + reply + [11, 12, 13]
    hits = llm.stats().prefix_cache_hits
    assert token_ids(llm.generate([turn], GREEDY)[0]) == token_ids(plain.generate([turn], GREEDY)[0])
    # The reply's tokens were decoded, not prefilled: their blocks are remembered at the finish.
    assert llm.stats().prefix_cache_hits - hits == (len(PROMPTS[0]) + len(reply) - 1) // 16 * 16


def test_a_reply_ending_on_a_block_boundary_is_remembered_only_where_its_kv_was_written(plain):
    """A finished sequence's last token was sampled, never fed: its KV slot is unwritten. A reply that
    fills its last block exactly leaves that block out of the cache, so a next turn resending it
    reads no unwritten slot: its logprobs equal the uncached engine's, not only its tokens."""
    llm = LLM("random:tiny-llama", enable_prefix_caching=True, **CPU32)
    prompt = PROMPTS[0]  # 58 tokens: a 6-token reply ends on the block boundary at 64
    reply = token_ids(
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    )
    assert (len(prompt) + len(reply)) % 16 == 0
    turn = [*prompt, *reply, 11, 12, 13]
    hits = llm.stats().prefix_cache_hits
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0)
    got, want = llm.generate([turn], params)[0].outputs[0], plain.generate([turn], params)[0].outputs[0]
    assert llm.stats().prefix_cache_hits - hits == 48, "three blocks: the fourth holds the unfed token"
    assert got.token_ids == want.token_ids
    assert got.cumulative_logprob == pytest.approx(want.cumulative_logprob, abs=1e-4)


def test_cached_prefixes_keep_penalties_biases_and_sampling_exact_through_preemption(plain):
    """Penalty state is entered at a sequence's first chunk, which now starts after its cached
    blocks; a small cache preempts, and recomputation finds its own blocks again."""
    params = [
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, repetition_penalty=1.5),
        SamplingParams(temperature=0.9, seed=4, max_tokens=20, ignore_eos=True, presence_penalty=1.0),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logit_bias={17: 2.0}, min_tokens=5),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
    ]
    want = [token_ids(plain.generate([p], q)[0]) for p, q in zip(PROMPTS, params, strict=True)]
    llm = LLM(
        "random:tiny-llama", enable_prefix_caching=True, kv_cache_blocks=9, max_num_batched_tokens=32,
        **CPU32,
    )  # fmt: skip
    llm.generate(PROMPTS[:1], GREEDY)  # the system prompt's blocks are in the cache
    got = [token_ids(o) for o in llm.generate(PROMPTS, params)]
    assert llm.executor.scheduler.num_preemptions > 0, "the cache is small enough to preempt"
    assert llm.stats().prefix_cache_hits > 0
    assert got == want


def test_the_switch_is_checked_and_off_by_default():
    assert parse_options({}).enable_prefix_caching is False
    assert parse_options({"enable_prefix_caching": True}).enable_prefix_caching is True
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        LLM("random:tiny-llama", enable_prefix_caching="yes", **CPU32)
    assert LLM("random:tiny-llama", **CPU32).executor.scheduler.prefix_cache is None


@pytest.mark.parametrize("engine_process", [False, True])
def test_cached_tokens_are_reported_and_a_reset_starts_cold(plain, engine_process):
    with LLM("random:tiny-llama", enable_prefix_caching=True, engine_process=engine_process, **CPU32) as llm:
        llm.generate(PROMPTS[:1], GREEDY)
        outs = llm.generate(PROMPTS[1:3], GREEDY)
        assert [o.num_cached_tokens for o in outs] == [48, 48]
        assert [token_ids(o) for o in outs] == [token_ids(o) for o in plain.generate(PROMPTS[1:3], GREEDY)]
        assert llm.reset_prefix_cache() is True
        again = llm.generate(PROMPTS[1:2], GREEDY)[0]
        assert again.num_cached_tokens == 0 and token_ids(again) == token_ids(outs[0])
        stats = llm.stats()
        assert stats.kv_blocks_free == stats.kv_blocks_total
    assert plain.reset_prefix_cache() is False, "no cache to reset"


@pytest.mark.parametrize("engine_process", [False, True])
def test_a_cache_salt_keeps_tenants_apart_and_finds_its_own_blocks(plain, engine_process):
    """vLLM's cache_salt: the same prompt under another salt (or none) finds nothing cached, so one
    tenant cannot time another's prompts; under its own salt it finds its blocks as any prompt does."""
    ids = PROMPTS[1]

    def cached(prompt):
        out = llm.generate([prompt], GREEDY)[0]
        assert token_ids(out) == want, "a salt changes which blocks are found, never the tokens"
        return out.num_cached_tokens

    want = token_ids(plain.generate([ids], GREEDY)[0])
    with LLM("random:tiny-llama", enable_prefix_caching=True, engine_process=engine_process, **CPU32) as llm:
        assert cached({"prompt_token_ids": ids, "cache_salt": "tenant-a"}) == 0
        assert cached({"prompt_token_ids": ids, "cache_salt": "tenant-b"}) == 0
        assert cached({"prompt_token_ids": ids}) == 0, "unsalted prompts do not find salted blocks"
        assert cached({"prompt_token_ids": ids, "cache_salt": "tenant-a"}) > 0
        assert cached(ids) > 0, "and an unsalted prompt the unsalted ones"
        for bad in ("", 7):
            with pytest.raises(RequestError, match="cache_salt must be a non-empty string"):
                llm.generate([{"prompt_token_ids": ids, "cache_salt": bad}], GREEDY)


@pytest.mark.slow
def test_tp2_with_a_prefix_cache_samples_what_one_rank_samples(plain):
    want = [token_ids(o) for o in plain.generate(PROMPTS, GREEDY)]
    with LLM("random:tiny-llama", tp=2, enable_prefix_caching=True, **CPU32) as llm:
        llm.generate(PROMPTS[:1], GREEDY)
        assert [token_ids(o) for o in llm.generate(PROMPTS, GREEDY)] == want
        assert llm.stats().prefix_cache_hits > 0
