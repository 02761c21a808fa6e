"""LLM.beam_search, vLLM's: against an independent search over the engine's own next-token logits, greedy
at width 1, EOS and length penalties on a scripted model, and clear errors for what it cannot take."""

import math
from types import SimpleNamespace

import pytest
import torch

from fastpath.runtime import LLM, BeamSearchOutput, BeamSearchParams, LoRARequest, SamplingParams
from fastpath.runtime.engine import beam_search as search
from fastpath.runtime.engine.outputs import Logprob

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56]]


@pytest.fixture(scope="module")
def llm():
    engine = LLM("random:tiny-llama", device="cpu", max_seq_len=64, enable_prefix_caching=True)
    yield engine
    engine.close()


def oracle(
    llm, prompt: list[int], width: int, steps: int, penalty: float = 1.0
) -> list[tuple[list[int], float]]:
    """Textbook beam search with vLLM's rules, over full next-token log-softmaxes of the engine's logits:
    each beam offers its 2 * width best tokens, the width best by score stay, an EOS ends a beam."""
    live, done = [(list(prompt), 0.0)], []

    def score(b):
        return b[1] / (len(b[0]) - (b[0][-1] in llm.eos_ids)) ** penalty

    for _ in range(steps):
        grown = []
        for tokens, cum in live:
            logprobs = torch.log_softmax(llm.prompt_logits(tokens).double(), -1)
            values, ids = logprobs.topk(2 * width)
            for v, t in zip(values.tolist(), ids.tolist(), strict=True):
                (done if t in llm.eos_ids else grown).append(([*tokens, t], cum + v))
        live = sorted(grown, key=score, reverse=True)[:width]
    return sorted(done + live, key=score, reverse=True)[:width]


def _check_against_oracle(llm, outs, width, steps, penalty=1.0):
    for prompt, out in zip(PROMPTS, outs, strict=True):
        want = oracle(llm, prompt, width, steps, penalty)
        assert [s.tokens for s in out.sequences] == [tokens for tokens, _ in want]
        for seq, (_, cum) in zip(out.sequences, want, strict=True):
            assert seq.cum_logprob == pytest.approx(cum, abs=1e-4)


@pytest.mark.parametrize("width", [2, 3])
def test_beams_are_an_independent_search_over_the_engines_logits(llm, width):
    outs = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=width, max_tokens=4))
    assert len(outs) == len(PROMPTS) and all(isinstance(o, BeamSearchOutput) for o in outs)
    _check_against_oracle(llm, outs, width, 4)
    tokenizer = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        for seq in out.sequences:
            # Each step's logprobs: the chosen token's among them, with its text, as generate() gives them.
            for i, t in enumerate(seq.tokens[len(prompt) :]):
                assert seq.logprobs[i][t].decoded_token == tokenizer.decode([t])
            assert len(seq.logprobs) == len(seq.tokens) - len(prompt) and seq.lora_request is None
            assert seq.finish_reason == "length" and seq.text == tokenizer.decode(seq.tokens)
        scores = [search.beam_score(s.tokens, s.cum_logprob, llm.eos_ids, 1.0) for s in out.sequences]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("penalty", [0.0, 1.0, 2.0])
def test_the_models_end_of_sequence_ends_beams_and_the_length_penalty_weighs_them(penalty):
    """With an end-of-sequence id the model often ranks high, beams end mid-search; the oracle and the
    engine agree on which, and on how each length penalty ranks finished beams against live ones."""
    engine = LLM("random:tiny-llama", device="cpu", max_seq_len=64)
    try:
        engine.eos_ids = frozenset(int(engine.prompt_logits(p).topk(3).indices[-1]) for p in PROMPTS)
        outs = engine.beam_search(
            PROMPTS, BeamSearchParams(beam_width=3, max_tokens=4, length_penalty=penalty)
        )
        _check_against_oracle(engine, outs, 3, 4, penalty)
        ended = [s for o in outs for s in o.sequences if s.finish_reason == "stop"]
        assert ended and all(s.tokens[-1] in engine.eos_ids for s in ended)
        assert all(
            s.tokens[-1] not in engine.eos_ids
            for o in outs
            for s in o.sequences
            if s.finish_reason == "length"
        )
    finally:
        engine.close()


def test_width_one_is_greedy_and_prompts_at_a_time_change_nothing(llm):
    greedy = llm.generate(
        PROMPTS, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), use_tqdm=False
    )
    beams = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True))
    for prompt, g, b in zip(PROMPTS, greedy, beams, strict=True):
        assert b.sequences[0].tokens == prompt + list(g.outputs[0].token_ids)
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    together = llm.beam_search(PROMPTS, params)
    one_by_one = llm.beam_search(PROMPTS, params, concurrency_limit=1)
    assert [[s.tokens for s in o.sequences] for o in together] == [
        [s.tokens for s in o.sequences] for o in one_by_one
    ]
    # One prompt, not in a list, as generate() takes it; a text prompt through the tokenizer.
    assert llm.beam_search(PROMPTS[0], params)[0].sequences[0].tokens == together[0].sequences[0].tokens
    text = llm.beam_search("hello there", params)[0].sequences[0]
    ids = llm.get_tokenizer().encode("hello there")
    assert text.tokens[: len(ids)] == ids and text.text == llm.get_tokenizer().decode(text.tokens)


def test_a_salted_search_finds_only_its_own_salts_blocks():
    """Every step of a salted prompt's search carries its cache_salt: a search under another salt finds
    only the blocks its own steps left, one under the same salt those of the earlier search too."""
    prompt = list(range(5, 45))  # two whole blocks and more: the first step's KV is worth finding
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    with LLM("random:tiny-llama", device="cpu", max_seq_len=64, enable_prefix_caching=True) as engine:

        def hits(salt):
            before = engine.stats().prefix_cache_hits
            out = engine.beam_search([{"prompt_token_ids": prompt, "cache_salt": salt}], params)
            return engine.stats().prefix_cache_hits - before, [s.tokens for s in out[0].sequences]

        first, tokens = hits("a")
        other, other_tokens = hits("b")
        again, again_tokens = hits("a")
    assert other == first, "salt b found nothing of salt a's search"
    assert again > first, "salt a found its earlier search's blocks"
    assert tokens == other_tokens == again_tokens


def test_one_progress_bar_counts_the_steps(monkeypatch):
    monkeypatch.delenv("FASTPATH_PROGRESS", raising=False)  # the suite hides bars; this one must show
    bars = []

    class Bar:
        def __init__(self, total, desc, dynamic_ncols):
            self.total, self.desc, self.done, self.closed = total, desc, 0, False
            bars.append(self)

        def update(self, n):
            self.done += n

        def close(self):
            self.closed = True

    llm = Scripted({1: {2: -0.5, 3: -0.6}, 2: {2: -0.5, 3: -0.6}, 3: {2: -0.5, 3: -0.6}})
    llm.width = 1
    search.beam_search(llm, [[1], [2], [3]], BeamSearchParams(beam_width=1, max_tokens=4), Bar, 2)
    assert [(b.total, b.desc, b.done, b.closed) for b in bars] == [(8, "Beam search", 8, True)]
    # Every beam ended at the first step: the bar still ends full.
    ended = Scripted({1: {0: -0.1, 4: -9.0}, 4: {0: -0.1, 4: -9.0}})
    ended.width = 1
    search.beam_search(ended, [[1]], BeamSearchParams(beam_width=1, max_tokens=5, length_penalty=0.0), Bar)
    assert bars[-1].done == 5 and bars[-1].closed


def test_what_beam_search_cannot_take_is_refused_by_name(llm):
    with pytest.raises(ValueError, match="beam_width must be an integer of at least 1"):
        BeamSearchParams(beam_width=0, max_tokens=3)
    with pytest.raises(ValueError, match="max_tokens must be an integer"):
        BeamSearchParams(beam_width=2, max_tokens=1.5)
    with pytest.raises(ValueError, match="length_penalty must be finite"):
        BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=math.nan)
    with pytest.raises(ValueError, match="temperature must be finite"):
        BeamSearchParams(beam_width=2, max_tokens=3, temperature=-1)
    with pytest.raises(ValueError, match="beam_width must be at most 10, got 11: each step asks"):
        BeamSearchParams(beam_width=11, max_tokens=3)
    with pytest.raises(ValueError, match="structured_outputs: .*does not follow a grammar"):
        BeamSearchParams(beam_width=2, max_tokens=3, structured_outputs={"json": {}})
    with pytest.raises(TypeError, match="takes a BeamSearchParams, got SamplingParams"):
        llm.beam_search(PROMPTS, SamplingParams(max_tokens=3))
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    with pytest.raises(ValueError, match="concurrency_limit must be an integer of at least 1"):
        llm.beam_search(PROMPTS, params, concurrency_limit=0)
    with pytest.raises(ValueError, match="beam_search prompt 1: .*exceed max_seq_len"):
        llm.beam_search([[1, 2], list(range(3, 65))], params)
    with pytest.raises(ValueError, match="beam_search prompt 0: .*out of range"):
        llm.beam_search([[10**7]], params)
    with pytest.raises(TypeError, match="lora_request must be a LoRARequest"):
        llm.beam_search(PROMPTS, params, lora_request=object())
    with pytest.raises(ValueError, match="beam_search prompt 0: .*enable_lora=True"):
        llm.beam_search(PROMPTS, params, lora_request=LoRARequest("a", 1, "/nowhere"))
    # Nothing was left running by the refusals: a search still works.
    assert len(llm.beam_search(PROMPTS[:1], params)[0].sequences) == 2


class Scripted:
    """A stand-in LLM whose next-token logprobs are a table keyed by the last token: enough to put EOS and
    lengths where a test wants them."""

    eos_ids = frozenset({0})
    tokenizer = SimpleNamespace(decode=lambda ids: " ".join(map(str, ids)))

    def __init__(self, table):
        self.table = table

    def generate(self, prompts, params, use_tqdm=False):
        assert params.max_tokens == 1 and params.logprobs == 2 * self.width
        outs = []
        for p in prompts:
            top = {t: Logprob(lp) for t, lp in self.table[p["prompt_token_ids"][-1]].items()}
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(logprobs=[top])]))
        return outs


def _run(table, params):
    llm = Scripted(table)
    llm.width = params.beam_width
    return search.beam_search(llm, [[1]], params)[0].sequences


def test_an_eos_ends_a_beam_and_the_length_penalty_weighs_finished_against_live_beams():
    # From 1: EOS (0) at -1.0, or 2 at -0.6; from 2: 3 at -0.6 or 4 at -0.7; then on at -0.6 and -0.7.
    table = {1: {0: -1.0, 2: -0.6}, 2: {3: -0.6, 4: -0.7}, 3: {3: -0.6, 4: -0.7}, 4: {3: -0.6, 4: -0.7}}
    short = _run(table, BeamSearchParams(beam_width=2, max_tokens=3))
    # The finished [1, 0] scores -1.0 / 1 (its EOS not counted); the live [1, 2, 3, 3] -1.8 / 4.
    assert [s.tokens for s in short] == [[1, 2, 3, 3], [1, 2, 3, 4]]
    assert [s.finish_reason for s in short] == ["length", "length"]
    # A length penalty of 0 scores the sums alone: the early EOS wins, its text without the EOS.
    flat = _run(table, BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=0.0))
    assert flat[0].tokens == [1, 0] and flat[0].finish_reason == "stop" and flat[0].text == "1 0"
    assert flat[0].cum_logprob == pytest.approx(-1.0)
    # Without a tokenizer there is no text.
    bare = Scripted(table)
    bare.tokenizer, bare.width = None, 2
    assert (
        search.beam_search(bare, [[1]], BeamSearchParams(beam_width=2, max_tokens=3))[0].sequences[0].text
        is None
    )
    # ignore_eos: an EOS extends like any token, and nothing finishes early.
    eager = {1: {0: -0.1, 2: -0.6}, 0: {0: -0.1, 2: -5.0}, 2: {2: -0.6, 3: -0.7}}
    assert _run(eager, BeamSearchParams(beam_width=1, max_tokens=3))[0].tokens == [1, 0]
    through = _run(eager, BeamSearchParams(beam_width=1, max_tokens=3, ignore_eos=True))
    assert through[0].tokens == [1, 0, 0, 0] and through[0].finish_reason == "length"
