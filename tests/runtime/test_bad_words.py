"""bad_words of several tokens, as vLLM bans them: a word's last token is banned only where the tokens
generated last are its first ones. Against an independent greedy search over the engine's own logits,
beside rows it must leave alone, through preemption, and in the penalty table's own terms."""

import math

import pytest
import torch
from test_sampling_controls import token_ids

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.token_biases import bad_word_ids, token_biases
from fastpath.runtime.kernels.sampling import BIAS_BIT, biases
from fastpath.runtime.runner.penalties import ANY, WORD_SEQUENCES, WORD_TOKENS, PenaltyFill, PenaltyTable

CPU32 = dict(device="cpu", dtype="float32", max_seq_len=64, max_batch_size=3)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9] * 12]
GREEDY = dict(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    engine = LLM("random:tiny-llama", **CPU32)
    yield engine
    engine.close()


def oracle(llm, prompt: list[int], sequences: list[list[int]], steps: int) -> list[int]:
    """Greedy decoding over the engine's next-token logits, banning a sequence's last token where the
    tokens generated so far end with its others (vLLM's rule: generated tokens only, not the prompt)."""
    out: list[int] = []
    for _ in range(steps):
        logits = llm.prompt_logits(prompt + out).float().clone()
        for seq in sequences:
            head = seq[:-1]
            if len(head) <= len(out) and out[len(out) - len(head) :] == head:
                logits[seq[-1]] = -math.inf
        out.append(int(logits.argmax()))
    return out


def repeated_word(llm, token: int, times: int) -> str:
    """A word that is `token` repeated, as the tokenizer encodes it back."""
    word = llm.tokenizer.decode([token] * times)
    assert bad_word_ids(word, llm.tokenizer)[0] == [token] * times, "the word must encode back to itself"
    return word


@pytest.mark.parametrize("times", [2, 3])
def test_a_word_of_several_tokens_is_banned_after_its_first_ones(llm, times):
    plain = [token_ids(o) for o in llm.generate(PROMPTS, SamplingParams(**GREEDY))]
    first = plain[0][0]
    assert plain[0][:times] == [first] * times, "the tiny model repeats its first token: the word is hit"
    word = repeated_word(llm, first, times)
    sequences = bad_word_ids(word, llm.tokenizer)
    params = [SamplingParams(**GREEDY, bad_words=[word]), SamplingParams(**GREEDY), SamplingParams(**GREEDY)]
    got = [token_ids(o) for o in llm.generate(PROMPTS, params)]
    want = oracle(llm, PROMPTS[0], sequences, GREEDY["max_tokens"])
    assert got[0] == want
    assert got[0] != plain[0], "the ban changed what greedy decoding picks"
    assert got[0][: times - 1] == plain[0][: times - 1], "the word's first tokens are not banned"
    for seq in sequences:
        n = len(seq)
        assert all(got[0][i : i + n] != seq for i in range(len(got[0]) - n + 1))
    assert got[1:] == plain[1:], "rows without words are left alone"


def test_a_words_tokens_in_the_prompt_do_not_count(llm):
    """vLLM matches a word's first tokens against generated tokens only."""
    first = token_ids(llm.generate(PROMPTS[:1], SamplingParams(**GREEDY))[0])[0]
    word = repeated_word(llm, first, 2)
    prompt = [*PROMPTS[0], first]
    got = token_ids(llm.generate([prompt], SamplingParams(**GREEDY, bad_words=[word]))[0])
    assert got == oracle(llm, prompt, bad_word_ids(word, llm.tokenizer), GREEDY["max_tokens"])


def test_sampled_rows_never_generate_the_word_and_the_ban_leaves_logprobs_raw(llm):
    first = token_ids(llm.generate(PROMPTS[:1], SamplingParams(**GREEDY))[0])[0]
    word = repeated_word(llm, first, 2)
    params = SamplingParams(
        temperature=0.3, seed=11, n=4, max_tokens=16, ignore_eos=True, bad_words=[word], logprobs=1
    )
    for out in llm.generate(PROMPTS, params):
        for c in out.outputs:
            assert all(c.token_ids[i : i + 2] != [first, first] for i in range(len(c.token_ids) - 1))
    # The logprobs are the raw logits', as vLLM's: where the ban held, the model's own top token
    # still ranks first in the returned top-1 though it was not picked.
    greedy = llm.generate(PROMPTS[:1], SamplingParams(**GREEDY, bad_words=[word], logprobs=1))[0].outputs[0]
    banned_at = next(i for i in range(1, len(greedy.token_ids)) if greedy.token_ids[i - 1] == first)
    top = greedy.logprobs[banned_at]
    assert any(lp.rank == 1 and t == first for t, lp in top.items())


def test_words_survive_chunked_prefill_preemption_and_slot_reuse():
    """A preempted request recomputes its prompt and generated tokens: its last generated ones are
    entered again, so a word half-generated before preemption is still banned after."""
    cfg = "random:tiny-llama"
    probe = LLM(cfg, **{**CPU32, "max_batch_size": 1})
    prompts = [list(range(3, 30)), PROMPTS[0], [9] * 20, [4, 5], PROMPTS[0]]
    plain = [token_ids(o) for o in probe.generate(prompts, SamplingParams(**GREEDY))]
    # Words the tokenizer encodes back to themselves, that greedy decoding of their rows generates.
    mid = next(plain[0][i : i + 2] for i in range(11) if repeated_pair(probe, plain[0][i : i + 2]))
    pair = plain[1][:2]
    words = [probe.tokenizer.decode(mid), repeated_word(probe, pair[0], 2)]
    params = [
        SamplingParams(**GREEDY, bad_words=words[:1]),
        SamplingParams(**GREEDY, bad_words=words, logit_bias={17: 2.0}),
        SamplingParams(**GREEDY),
        SamplingParams(temperature=0.9, seed=4, max_tokens=12, ignore_eos=True, bad_words=words),
        SamplingParams(temperature=0.5, seed=2, max_tokens=12, ignore_eos=True, bad_words=words[1:]),
    ]
    want = [token_ids(probe.generate([p], q)[0]) for p, q in zip(prompts, params, strict=True)]
    assert want[0] != plain[0] and want[1] != plain[1], "the words change those rows"
    llm = LLM(cfg, **{**CPU32, "max_num_batched_tokens": 16, "kv_cache_blocks": 5})
    got = [token_ids(o) for o in llm.generate(prompts, params)]
    assert llm.executor.scheduler.num_preemptions > 0, "the cache is small enough to preempt"
    assert got == want


def repeated_pair(llm, ids: list[int]) -> bool:
    word = llm.tokenizer.decode(ids)
    return bool(word.strip()) and bad_word_ids(word, llm.tokenizer)[:1] == [ids]


def test_long_and_many_words_are_refused_by_name(llm):
    long = llm.tokenizer.decode([209] * (WORD_TOKENS + 1))
    with pytest.raises(
        ValueError, match=rf"bad_words: .* is {WORD_TOKENS + 1} tokens; .* at most {WORD_TOKENS}"
    ):
        llm.generate(PROMPTS[:1], SamplingParams(bad_words=[long]))

    class Tok:  # every character a token: "xy" is two
        def encode(self, text, add_special_tokens=False):
            return [ord(c) % 500 for c in text]

    many = [chr(0x100 + i) + "z" for i in range(WORD_SEQUENCES + 1)]
    with pytest.raises(
        ValueError, match=rf"{WORD_SEQUENCES + 1} token sequences .* at most {WORD_SEQUENCES}"
    ):
        token_biases(SamplingParams(bad_words=many), Tok(), 512)
    biases = token_biases(SamplingParams(bad_words=["ab", "b", "cab"]), Tok(), 512)
    assert biases.ids == (98,) and biases.sequences == ((97, 98), (99, 97, 98))
    assert token_ids(llm.generate(PROMPTS[:1], SamplingParams(**GREEDY))[0]), "the engine runs on"


def _table_with_words(
    slot_words: dict[int, list[list[int]]], generated: dict[int, list[int]]
) -> PenaltyTable:
    """A table whose slots hold these words, after prompts [0] and these generated tokens."""
    table = PenaltyTable(4, 100, torch.device("cpu"))
    slots = sorted(slot_words)
    k = max(len(w) for w in slot_words.values())
    words = torch.full((len(slots), k, WORD_TOKENS), -1, dtype=torch.int64)
    for i, s in enumerate(slots):
        for j, seq in enumerate(slot_words[s]):
            words[i, j] = torch.tensor([ANY] * (WORD_TOKENS - len(seq)) + seq)
    tokens = [[0, *generated.get(s, [])] for s in slots]
    fill = PenaltyFill(
        torch.tensor(slots),
        torch.ones(len(slots), dtype=torch.int64),
        torch.tensor([len(t) for t in tokens]),
        torch.tensor([t for row in tokens for t in row]),
        torch.full((len(slots), 1), -1),
        exclusive=torch.zeros(len(slots), dtype=torch.int64),
        bias_ids=torch.tensor([[40]] * len(slots)),
        bias_bits=torch.tensor([[0x3F800000]] * len(slots)),  # 1.0
        words=words,
    )
    table.fill(fill)
    return table


def test_the_table_bans_where_the_prefix_came_last_and_lifts_the_ban_exactly():
    # Slot 1: (5, 7) and (6, 7) end in one token, only the first is hit; (5, 40) hits a token that
    # has a bias of its own. Slot 2: (8, 9, 10) needs two tokens it has not generated in that order.
    table = _table_with_words({1: [[5, 7], [6, 7], [5, 40]], 2: [[8, 9, 10]]}, {1: [3, 5], 2: [9, 8]})
    before = table._padded.clone()
    slots = torch.tensor([1, 2, 0, 0])
    ban = table.ban_words(slots)
    bias = biases(table.entries)
    assert table.entries[1, 7] & BIAS_BIT and bias[1, 7] == -math.inf
    assert bias[1, 40] == -math.inf, "a word's ban overrides the token's own bias while it holds"
    assert not table.entries[2, 10] & BIAS_BIT and bias[2, 10] == 0
    assert (table.bits[1, 0] >> 7) & 1, "the summary marks a word's last token"
    table.entries[1, 12] += 1  # the sampler records a token meanwhile
    table.lift_words(ban)
    after = before.clone()
    after[1, 12] += 1
    assert torch.equal(table._padded, after), "only the recorded count remains"
    table.remember(slots, torch.tensor([8, 9, 77, 78]))
    assert table.recent[1, -3:].tolist() == [3, 5, 8]
    assert table.recent[2, -3:].tolist() == [9, 8, 9]
    assert (table.recent[0] == -1).all(), "slot 0 holds nothing"
    table.remember(slots, torch.tensor([11, 10, 0, 0]))  # slot 2: ... 8, 9, 10 was generated: no ban needed
    table.remember(slots, torch.tensor([11, 8, 0, 0]))
    table.remember(slots, torch.tensor([11, 9, 0, 0]))
    table.ban_words(slots)
    assert table.entries[2, 10] & BIAS_BIT and biases(table.entries)[2, 10] == -math.inf
