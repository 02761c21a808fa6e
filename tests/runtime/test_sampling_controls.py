"""Penalties, min_tokens, min_p and top-k logprobs through `LLM.generate`, on the CPU in fp32.

HF transformers is the oracle where it has the control (repetition_penalty, min_new_tokens, the
log-softmax of its logits); min_p, presence and frequency penalties are checked against a
reference written here from their published definitions, replaying the engine's seeded noise.
"""

import pytest
import torch
from checkpoints import ARCHS
from oracle import hf_model

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.runner.sampler import uniform_noise

PROMPTS = [[1, 5, 9, 33, 7, 5, 9], list(range(3, 40)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]]
CPU32 = dict(device="cpu", dtype="float32", max_seq_len=256, max_batch_size=4)


# --- the one place that knows the output shape ------------------------------------------------------


def token_ids(out) -> list[int]:
    """Generated ids: vLLM's shape (out.outputs[0]) or the flat one (out.token_ids)."""
    return list(out.outputs[0].token_ids) if hasattr(out, "outputs") else list(out.token_ids)


def chosen_logprobs(out) -> list[float]:
    """The logprob of each generated token: from vLLM's dicts, or the flat list."""
    if hasattr(out, "outputs"):
        c = out.outputs[0]
        return [d[t].logprob for d, t in zip(c.logprobs, c.token_ids, strict=True)]
    return list(out.logprobs)


def top_logprobs(outs, recorder) -> list[list[dict[int, float]]]:
    """Per output, per generated token, {token id: logprob} of the top-k: from vLLM-shaped outputs
    (dicts of Logprob), else from what the engine read back (`recorder`, flat outputs carry none)."""
    if hasattr(outs[0], "outputs"):
        return [[{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs] for o in outs]
    return [recorder.tops[i] for i in range(len(outs))]


class TopRecorder:
    """Records each accepted token's top-k logprobs as the executor completes a step."""

    def __init__(self, llm):
        self.tops: dict[int, list[dict[int, float]]] = {}
        executor, complete = llm.executor, llm.executor.complete

        def recording(step):
            if step.host.top_ids is not None:
                live = [s for s in step.sampled if not s.finished]
                rows = {id(s): i for i, s in enumerate(step.sampled)}
                record = complete(step)
                for seq in live:
                    r = rows[id(seq)]
                    ids, lps = step.host.top_ids[r].tolist(), step.host.top_logprobs[r].tolist()
                    self.tops.setdefault(seq.index, []).append(dict(zip(ids, lps, strict=True)))
                return record
            return complete(step)

        executor.complete = recording


def _llm(path, **kw):
    return LLM(str(path), **{**CPU32, **kw})


# --- HF as the oracle -------------------------------------------------------------------------------


def hf_generate(path, prompt, n, **kw) -> list[int]:
    model = hf_model(str(path))
    kw = {"eos_token_id": None, "min_new_tokens": n, **kw}
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0, **kw)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_with_repetition_penalty_equals_hf(hf_checkpoints, arch):
    path = hf_checkpoints[arch]
    llm = _llm(path)
    plain = [
        token_ids(o)
        for o in llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    ]
    for penalty in (1.3, 0.8):
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, repetition_penalty=penalty)
        got = [token_ids(o) for o in llm.generate(PROMPTS, params)]
        for prompt, ours in zip(PROMPTS, got, strict=True):
            assert ours == hf_generate(path, prompt, 24, repetition_penalty=penalty), f"{arch} x{penalty}"
        assert got != plain, "the penalty changes what greedy picks"


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_with_min_tokens_equals_hf_min_new_tokens(hf_checkpoints, arch):
    path = hf_checkpoints[arch]
    llm = _llm(path)
    eos = sorted(llm.eos_ids)
    for prompt in PROMPTS:
        plain = hf_generate(path, prompt, 20)
        stop = plain[1]  # greedy would stop at its second token
        early = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop]))[
            0
        ]
        assert len(token_ids(early)) <= 2
        params = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=6, stop_token_ids=[stop])
        ours = token_ids(llm.generate([prompt], params)[0])
        ref = hf_generate(path, prompt, 20, min_new_tokens=6, eos_token_id=[*eos, stop])
        ref = ref[: next((i + 1 for i, t in enumerate(ref) if t in (*eos, stop)), len(ref))]
        assert ours == ref, f"{arch}: prompt of {len(prompt)} tokens"
        assert len(ours) >= 6 and stop not in ours[:5]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_top_logprobs_equal_hf_log_softmax(hf_checkpoints, arch):
    path = hf_checkpoints[arch]
    llm = _llm(path)
    recorder = TopRecorder(llm)
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5),
        SamplingParams(max_tokens=12, ignore_eos=True, logprobs=3, temperature=0.9, seed=4),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1, repetition_penalty=1.5),
    ]
    outs = llm.generate(PROMPTS[:3], params)
    model = hf_model(str(path))
    for prompt, out, p, tops in zip(PROMPTS, outs, params, top_logprobs(outs, recorder), strict=False):
        ids = token_ids(out)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        ref = torch.log_softmax(logits, dim=-1)
        assert len(tops) == len(ids)
        for step, (token, top) in enumerate(zip(ids, tops, strict=True)):
            want_lp, want_ids = ref[step].topk(p.logprobs)
            got = sorted(top.items(), key=lambda kv: -kv[1])[: p.logprobs]
            assert [t for t, _ in got] == want_ids.tolist(), f"{arch} step {step}"
            assert [lp for _, lp in got] == pytest.approx(want_lp.tolist(), abs=1e-4)
            if token in top:  # the chosen token's logprob is the raw one, whatever the penalties did
                assert top[token] == pytest.approx(float(ref[step, token]), abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_every_chosen_token_has_its_rank_among_hf_logits(hf_checkpoints, arch):
    """vLLM's rank (1 + how many tokens the model rated higher) for the chosen token, in or out of the
    top-k, sampled hot enough to leave it often, with logprobs=0 and with a top-2; greedy ranks 1."""
    path = hf_checkpoints[arch]
    llm = _llm(path)
    params = [
        SamplingParams(temperature=2.0, seed=5, max_tokens=12, ignore_eos=True, logprobs=0),
        SamplingParams(temperature=1.5, seed=6, max_tokens=12, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0),
    ]
    outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
    model = hf_model(str(path))
    beyond_top = 0
    for prompt, out in zip(PROMPTS, outs, strict=False):
        ids, positions = token_ids(out), out.outputs[0].logprobs
        with torch.no_grad():
            ref = torch.log_softmax(
                model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float(), -1
            )
        for step, (token, entry) in enumerate(zip(ids, positions, strict=True)):
            lp = ref[step, token]
            # Between the tokens HF rates clearly higher and those it rates at least as high.
            low, high = int((ref[step] > lp + 1e-4).sum()) + 1, int((ref[step] >= lp - 1e-4).sum())
            assert low <= entry[token].rank <= high, f"{arch} step {step}: rank {entry[token].rank}"
            beyond_top += entry[token].rank > 2
    assert beyond_top >= 3, "the hot rows drew tokens outside their top-k"
    assert all(e[t].rank == 1 for t, e in zip(token_ids(outs[2]), outs[2].outputs[0].logprobs, strict=True))


# --- a reference from the published definitions ----------------------------------------------------


def reference_tokens(llm, prompt, n, p: SamplingParams) -> list[int]:
    """Tokens the definitions give, step by step, from the engine's own logits and seeded noise.

    OpenAI: logit - frequency * count - presence * (count > 0), over generated tokens; then
    temperature; top-k; top-p over the renormalized top-k; min_p: keep p >= min_p * max p; then a
    draw by Gumbel-max with the engine's noise u(seed, step, token).
    """
    out = []
    for step in range(n):
        x = llm.prompt_logits(prompt + out)
        vocab = x.shape[0]
        count = torch.bincount(torch.tensor(out, dtype=torch.int64), minlength=vocab).float()
        x = x - p.frequency_penalty * count - p.presence_penalty * (count > 0).float()
        s = x / p.temperature
        keep = torch.ones(vocab, dtype=torch.bool)
        if p.top_k > 0:
            keep &= s >= s.topk(p.top_k).values[-1]
        probs = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
        if p.top_p < 1:
            sorted_probs, order = probs.sort(descending=True)
            before = sorted_probs.cumsum(0) - sorted_probs
            keep[order[before >= p.top_p]] = False
            keep[order[0]] = True
        keep &= probs >= p.min_p * probs.max()
        u = uniform_noise(torch.tensor([p.seed]), torch.tensor([step]), vocab)[0]
        z = (s - torch.log(-torch.log(u))).masked_fill(~keep, float("-inf"))
        out.append(int(z.argmax()))
    return out


CASES = {
    "min_p": dict(temperature=1.5, min_p=0.2),
    "presence": dict(temperature=0.7, presence_penalty=1.5),
    "frequency": dict(temperature=0.7, frequency_penalty=0.6),
    "negative penalties": dict(temperature=0.7, presence_penalty=-0.5, frequency_penalty=-0.3),
    "all of them": dict(
        temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.5
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_min_p_and_openai_penalties_match_their_definitions(hf_checkpoints, case):
    llm = _llm(hf_checkpoints["llama"])
    params = SamplingParams(max_tokens=16, ignore_eos=True, seed=21, **CASES[case])
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert token_ids(out) == reference_tokens(llm, prompt, 16, params), f"{case}: prompt of {len(prompt)}"
    base = SamplingParams(max_tokens=16, ignore_eos=True, seed=21, temperature=params.temperature)
    assert [token_ids(o) for o in llm.generate(PROMPTS, base)] != [token_ids(o) for o in outs]
