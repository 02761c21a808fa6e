"""The general sampler on a CUDA device: the fused kernels against their torch definition, inside the
captured decode graphs for every batch size, one replay per step for a mixed batch, and HF parity."""

import pytest
import torch
from oracle import hf_model
from test_sampling_controls import token_ids

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine.token_biases import bad_word_ids
from fastpath.runtime.kernels import sampling_rank, sampling_triton
from fastpath.runtime.kernels.sampling import BIAS_BIT, PROMPT_BIT, rank_counts_reference, sample_reference
from fastpath.runtime.runner.penalties import PenaltyTable
from fastpath.runtime.runner.sampler import SamplingTensors

pytestmark = pytest.mark.gpu

EXACT_GRAPHS = list(range(1, 9))
# The bench's "sampled with penalties" row (bench/decode.py).
BENCH = dict(
    temperature=0.8, top_p=0.95, top_k=50, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
    frequency_penalty=0.5, logprobs=5,
)  # fmt: skip


def _mixed(n: int, max_tokens: int = 24, spread: int = 0) -> list[SamplingParams]:
    """n requests of the kinds a batch mixes; with `spread`, request i stops `spread * i` tokens later."""
    kinds = [
        dict(temperature=0.0),
        dict(temperature=0.9, seed=2),
        dict(temperature=0.0, repetition_penalty=1.3),
        dict(seed=5, **BENCH),
        dict(temperature=0.0, min_tokens=8, stop_token_ids=[5, 6, 7]),
        dict(temperature=1.1, top_p=0.9, frequency_penalty=0.4, seed=9),
        dict(temperature=0.7, min_p=0.1, presence_penalty=-0.5, seed=1, logprobs=3),
        dict(temperature=1.0, top_k=3, seed=4),
    ]
    return [
        SamplingParams(max_tokens=max_tokens + spread * i, ignore_eos=True, **kinds[i % len(kinds)])
        for i in range(n)
    ]


def _table(rows: int, vocab: int, device) -> PenaltyTable:
    g = torch.Generator().manual_seed(1)
    t = PenaltyTable(rows + 1, vocab, torch.device("cpu"))
    for slot in range(1, rows + 1):
        toks = torch.randint(0, vocab, (60,), generator=g)
        t.entries[slot, toks[:30]] |= PROMPT_BIT
        t.entries[slot, toks[20:]] += 1
        if slot % 8 == 4:  # logit_bias with some bans (bad_words), over penalized tokens too
            some = torch.cat([toks[10:30], torch.randint(0, vocab, (20,), generator=g)])
            t.entries[slot, some] |= BIAS_BIT
            t.biases[slot, some] = torch.randn(len(some), generator=g) * 2
            t.biases[slot, some[::5]] = float("-inf")
        elif slot % 8 == 6:  # allowed_token_ids: every other token banned
            t.entries[slot] |= BIAS_BIT
            t.biases[slot] = float("-inf")
            t.biases[slot, torch.randint(0, vocab, (50,), generator=g)] = 0.5
    t.bits.copy_(t._pack(list(range(rows + 1))))
    out = PenaltyTable(rows + 1, vocab, torch.device(device))
    out._padded.copy_(t._padded)  # entries and biases
    out.bits.copy_(t.bits)
    return out


@pytest.mark.parametrize("vocab", [32000, 128256])
def test_fused_sampler_equals_its_definition_on_cuda(vocab):
    rows = 64
    g = torch.Generator(device="cuda").manual_seed(0)
    scale = torch.tensor([0.1, 1.0, 3.0, 8.0], device="cuda").repeat(rows // 4)[:, None]
    logits = (torch.randn(rows, vocab, generator=g, device="cuda") * scale).bfloat16()
    p = SamplingTensors.neutral(
        rows, "cuda",
        temperature=[0.0, 0.8, 1.0, 1.3] * (rows // 4),
        top_k=[0, 50, 0, 1000, 0, 5, 0, 0] * (rows // 8),
        top_p=[1.0, 0.95, 0.9, 0.5] * (rows // 4),
        min_p=[0.0, 0.05, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0] * (rows // 8),
        seeds=list(range(rows)),
        slots=list(range(1, rows + 1)),
        repetition=[1.1] * rows,
        presence=[0.5] * rows,
        frequency=[0.5] * rows,
    )  # fmt: skip
    p.data[:, sampling_rank.RANKS_FIELD] = 1  # every row asks for its token's rank
    ta, tb = _table(rows, vocab, "cuda"), _table(rows, vocab, "cuda")
    ref = sample_reference(logits, p, ta.entries, ta.bits, 20)
    paths = torch.zeros(rows, dtype=torch.int32, device="cuda")
    known = torch.full((rows,), -7, dtype=torch.int32, device="cuda")
    got = sampling_triton.sample(logits, p, tb.entries, tb.bits, 20, paths=paths, listed_ranks=known)
    # Token choices compare floats from exp and log, whose last bits differ between torch and
    # Triton's fast versions: a row may flip where two draws tie to those bits, almost never.
    same = (ref[0] == got[0]).float().mean().item()
    assert same >= 0.98, f"{same:.3f} of the rows agree"
    assert torch.allclose(ref[1], got[1], atol=1e-4)
    assert torch.equal(ref[2], got[2]), "top-k logprob ids: comparisons only, exact"
    assert torch.allclose(ref[3], got[3], atol=1e-4)
    bench_rows = [r for r in range(rows) if r % 8 == 1]  # temperature 0.8, top-k 50, top-p 0.95
    assert all(int(paths[r]) == 1 for r in bench_rows), (
        f"the bench's rows take the fast path: {paths.tolist()}"
    )
    # Ranks: from the list of top raw logits where it holds them (exact), else by the rank kernel.
    want = rank_counts_reference(logits, got[0])[:, 0].int()
    listed = known >= 0
    assert bool((known[~listed] == -1).all()) and torch.equal(known[listed], want[listed])
    assert sum(bool(listed[r]) for r in bench_rows) >= len(bench_rows) // 2, f"listed: {listed.tolist()}"
    counts = sampling_rank.rank_counts(logits, p, got[0], got[2], known=known)
    assert torch.equal(counts.sum(1).int(), want)


def _engine(**kw):
    return LLM(
        "random:tiny-llama", device="cuda", dtype="bfloat16", max_seq_len=256, max_batch_size=8,
        fmha_enabled=["triton_decode", "sdpa_math"], **kw,
    )  # fmt: skip


def _run(llm, prompts, params):
    outs = llm.generate(prompts, params)
    return [token_ids(o) for o in outs]


def test_general_graphs_equal_eager_with_penalties_min_tokens_and_logprobs():
    prompts = [list(range(3, 3 + n)) for n in (1, 17, 5, 64, 9, 33, 2, 40)]
    params = _mixed(len(prompts), max_tokens=8, spread=4)  # the batch shrinks through every size
    eager = _engine(cuda_graphs=False).generate(prompts, params)
    llm = _engine(cuda_graphs=True, graph_batch_sizes=EXACT_GRAPHS)
    kinds = {k for _, k in llm.executor.graphs.graphs}
    guided = {"guided_greedy", "guided_general"} if llm.executor.guided is not None else set()
    assert kinds == {"greedy", "general"} | guided, kinds
    graphed = llm.generate(prompts, params)
    assert [token_ids(o) for o in graphed] == [token_ids(o) for o in eager]


def test_a_mixed_batch_replays_one_general_graph_per_decode_step():
    llm = _engine(cuda_graphs=True, graph_batch_sizes=EXACT_GRAPHS)
    runner = llm.executor.runner
    replays, eager = [], []
    replay, forward = runner.graphs.replay, runner.decode_forward

    def counting_replay(rows, kind):
        replays.append(kind)
        return replay(rows, kind)

    def counting_forward(*a, capturing=False, **kw):
        if not capturing:
            eager.append(1)
        return forward(*a, capturing=capturing, **kw)

    runner.graphs.replay, runner.decode_forward = counting_replay, counting_forward
    prompts = [[4, 5, 6]] * 8
    _run(llm, prompts, _mixed(8, max_tokens=16))
    assert replays and set(replays) == {"general"} and not eager
    replays.clear()
    _run(llm, prompts, [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)] * 8)
    assert set(replays) == {"greedy"}, "a greedy-only batch keeps the greedy graph"


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_with_repetition_penalty_equals_hf_on_cuda_in_graphs(hf_checkpoints, arch):
    path = hf_checkpoints[arch]
    llm = LLM(str(path), device="cuda", dtype="float32", max_seq_len=256, max_batch_size=4,
              graph_batch_sizes=[1, 2, 4])  # fmt: skip
    prompts = [[1, 5, 9, 33, 7, 5, 9], list(range(3, 40)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, repetition_penalty=1.3)
    got = _run(llm, prompts, params)
    model = hf_model(str(path), torch.float32, "cuda")
    for prompt, ours in zip(prompts, got, strict=True):
        ref = model.generate(
            torch.tensor([prompt], device="cuda"), max_new_tokens=24, min_new_tokens=24, do_sample=False,
            repetition_penalty=1.3, eos_token_id=None, pad_token_id=0,
        )[0, len(prompt) :].tolist()  # fmt: skip
        assert ours == ref, f"{arch}: prompt of {len(prompt)} tokens"


def test_bad_words_of_several_tokens_in_a_graphed_engine_equal_eager_and_leave_other_rows_alone():
    """A step with such a word runs eagerly beside graphs that replay the other steps; the other rows'
    tokens equal a run without the word, and the word's row equals the eager engine's."""
    graphed = _engine(cuda_graphs=True, graph_batch_sizes=EXACT_GRAPHS)
    prompts = [[4, 5, 6], list(range(3, 20)), [7, 7, 8, 200, 13]]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = _run(graphed, prompts, greedy)
    tok = graphed.tokenizer
    # Two tokens some row generates after its first, as a word whose token sequences (vLLM's: the
    # word, and after a space) hold them; the first such row takes the word.
    found = next(
        ((r, row[i : i + 2]) for r, row in enumerate(plain) for i in range(1, len(row) - 1)
         if row[i : i + 2] in bad_word_ids(tok.decode(row[i : i + 2]), tok)),
        None,
    )  # fmt: skip
    assert found is not None, f"no two generated tokens make a word: {plain}"
    r, pair = found
    word, other, third = tok.decode(pair), (r + 1) % 3, (r + 2) % 3
    params = [greedy] * 3
    params[r] = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, bad_words=[word])
    params[third] = SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True, bad_words=[word])
    got = _run(graphed, prompts, params)
    assert got == _run(_engine(cuda_graphs=False), prompts, params)
    assert got[other] == plain[other]
    assert got[r] != plain[r], "the word changed the greedy row"
    for row in (got[r], got[third]):
        assert all(row[i : i + 2] != pair for i in range(len(row) - 1))
