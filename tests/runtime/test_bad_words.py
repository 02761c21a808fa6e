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


def test_words_survive_preemption_and_requests_admitted_beside_a_step(monkeypatch):
    """A preempted request recomputes its prompt and generated tokens: its last generated ones are
    entered again, so a word half-generated before preemption is still banned after. Every row equals
    the greedy search, though a small cache preempts and mixed batches admit rows beside a step."""
    cfg = dict(device="cpu", max_seq_len=96, max_batch_size=4, max_num_batched_tokens=16, mixed_batches=True)
    probe = LLM("random:tiny-qwen2", **{**cfg, "max_num_batched_tokens": 48})
    prompts = [list(range(3 + k, 3 + k + n)) for k, n in enumerate((9, 30, 4, 17, 1, 25, 12, 6, 40, 3))]
    plain = [token_ids(o) for o in probe.generate(prompts, SamplingParams(**GREEDY))]
    words = [word_in(probe, out) for out in plain]
    assert sum(w is not None for w in words) >= 5, "most rows generate a word that encodes back to itself"
    params = [SamplingParams(**GREEDY, bad_words=[w]) if w else SamplingParams(**GREEDY) for w in words]
    sequences = [bad_word_ids(w, probe.tokenizer) if w else [] for w in words]
    want = [oracle(probe, p, seqs, GREEDY["max_tokens"]) for p, seqs in zip(prompts, sequences, strict=True)]
    assert sum(w != p for w, p in zip(want, plain, strict=True)) >= 5, "the words change those rows"

    refilled = []  # generated tokens each refilled row with words had
    enter = PenaltyTable._words

    def spy(self, fill, slots):
        refilled.extend((fill.lens - fill.prompt_lens).tolist())
        return enter(self, fill, slots)

    monkeypatch.setattr(PenaltyTable, "_words", spy)
    llm = LLM("random:tiny-qwen2", kv_cache_blocks=8, **cfg)
    got = [token_ids(o) for o in llm.generate(prompts, params)]
    assert llm.executor.scheduler.num_preemptions > 0, "the cache is small enough to preempt"
    assert any(n > 0 for n in refilled), "a row with words was recomputed after generating tokens"
    assert got == want


def test_a_word_half_generated_when_its_row_is_preempted_is_banned_after_the_recompute():
    """Five blocks: the newer row is preempted once, right after generating the first token of its
    word (209, 209 each other step); entered again with its generated tokens, its next token is
    still banned. (Without them, this row's tokens differ from the search's: checked when written.)"""
    llm = LLM("random:tiny-llama", **{**CPU32, "kv_cache_blocks": 5, "max_num_batched_tokens": 16})
    first = token_ids(llm.generate(PROMPTS[:1], SamplingParams(**GREEDY))[0])[0]
    word = repeated_word(llm, first, 2)
    steps = dict(GREEDY, max_tokens=24)
    prompts = [list(range(3, 40)), PROMPTS[0]]
    params = [SamplingParams(**steps), SamplingParams(**steps, bad_words=[word])]
    before = llm.executor.scheduler.num_preemptions
    got = [token_ids(o) for o in llm.generate(prompts, params)]
    assert llm.executor.scheduler.num_preemptions > before
    assert got[1] == oracle(llm, prompts[1], bad_word_ids(word, llm.tokenizer), 24)
    assert got[0] == oracle(llm, prompts[0], [], 24)


def word_in(llm, out: list[int]) -> str | None:
    """A word of 2 or 3 tokens that `out` generates after its first two, encoding back to itself."""
    for i in range(2, len(out) - 1):
        for n in (2, 3):
            ids = out[i : i + n]
            word = llm.tokenizer.decode(ids)
            if len(ids) == n and word.strip() and bad_word_ids(word, llm.tokenizer)[:1] == [ids]:
                return word
    return None


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
    # has a bias of its own; (5, 63) ends in the sign bit of its summary word. Slot 2: (8, 9, 10)
    # needs two tokens it has not generated in that order.
    words = {1: [[5, 7], [6, 7], [5, 40], [5, 63]], 2: [[8, 9, 10]]}
    table = _table_with_words(words, {1: [3, 5], 2: [9, 8]})
    before = table._padded.clone()
    slots = torch.tensor([1, 2, 0, 0])
    ban = table.ban_words(slots)
    bias = biases(table.entries)
    assert table.entries[1, 7] & BIAS_BIT and bias[1, 7] == -math.inf
    assert bias[1, 40] == -math.inf, "a word's ban overrides the token's own bias while it holds"
    assert not table.entries[2, 10] & BIAS_BIT and bias[2, 10] == 0
    assert (table.bits[1, 0] >> 7) & 1, "the summary marks a word's last token"
    assert table.bits[1, 1] < 0 and table.entries[1, 63] & BIAS_BIT and bias[1, 63] == -math.inf
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
