"""`echo` on /v1/completions: the prompt in front of each choice, with its logprobs when asked, and
`max_tokens: 0` for the prompt alone (how evaluation harnesses score a prompt through a server).
Offline `generate` with prompt_logprobs is the oracle."""

import httpx
import pytest
from serve_helpers import client, running

from fastpath.runtime import SamplingParams

PROMPT = "The quick brown fox jumps"


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def _offline(llm, prompt, max_tokens, k):
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=k, prompt_logprobs=k
    )
    return llm.generate([prompt], params, use_tqdm=False)[0]


def test_echo_puts_the_prompt_before_the_completion(url, llm):
    r = client(url).completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, echo=True, extra_body={"ignore_eos": True}
    )
    expected = _offline(llm, PROMPT, 6, None)
    assert r.choices[0].text == PROMPT + expected.outputs[0].text
    assert r.usage.completion_tokens == 6


@pytest.mark.parametrize("prompt_as_ids", [False, True])
def test_echo_with_max_tokens_0_scores_the_prompt_alone(url, llm, prompt_as_ids):
    expected = _offline(llm, PROMPT, 1, 2)
    ids = expected.prompt_token_ids
    r = client(url).completions.create(
        model="tiny",
        prompt=ids if prompt_as_ids else PROMPT,
        max_tokens=0,
        temperature=0,
        echo=True,
        logprobs=2,
    )
    (choice,) = r.choices
    text = llm.get_tokenizer().decode(ids) if prompt_as_ids else PROMPT
    assert choice.text == text
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = [
        position[token].logprob for token, position in zip(ids[1:], expected.prompt_logprobs[1:], strict=True)
    ]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-6)
    for j, top in enumerate(lp.top_logprobs[1:], 1):
        assert lp.tokens[j] in top and 2 <= len(top) <= 3
        assert max(top.values()) == pytest.approx(
            max(e.logprob for e in expected.prompt_logprobs[j].values()), abs=1e-6
        )
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_echo_with_logprobs_continues_into_the_completion(url, llm):
    expected = _offline(llm, PROMPT, 3, 1)
    r = client(url).completions.create(
        model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    lp = r.choices[0].logprobs
    n_prompt = len(expected.prompt_token_ids)
    assert len(lp.token_logprobs) == n_prompt + 3
    generated = expected.outputs[0]
    want = [position[t].logprob for t, position in zip(generated.token_ids, generated.logprobs, strict=True)]
    assert lp.token_logprobs[n_prompt:] == pytest.approx(want, abs=1e-6)
    # offsets run on from the prompt's tokens into the completion's
    assert lp.text_offset[n_prompt] == lp.text_offset[n_prompt - 1] + len(lp.tokens[n_prompt - 1])
    assert lp.text_offset == sorted(lp.text_offset)


def test_a_streamed_echo_equals_the_whole_one(url):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=1)
    whole = client(url).completions.create(**kw, extra_body={"ignore_eos": True})
    chunks = list(client(url).completions.create(**kw, stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        joined = [v for c in chunks if c.choices[0].logprobs for v in getattr(c.choices[0].logprobs, key)]
        assert joined == getattr(whole.choices[0].logprobs, key), key
    only = list(client(url).completions.create(**{**kw, "max_tokens": 0}, stream=True))
    assert [c.choices[0].text for c in only] == [PROMPT]
    assert only[0].choices[0].finish_reason == "length"


def test_max_tokens_0_without_echo_is_refused_naming_the_field(url):
    r = httpx.post(
        f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 0}, timeout=30
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"


def test_each_choice_of_several_prompts_echoes_its_own_prompt(url, llm):
    prompts = ["First prompt", "Second one here"]
    r = client(url).completions.create(
        model="tiny", prompt=prompts, n=2, max_tokens=3, temperature=0.8, seed=3, echo=True, logprobs=1
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        prompt = prompts[c.index // 2]
        expected = _offline(llm, prompt, 1, 1)
        ids = expected.prompt_token_ids
        assert c.text.startswith(prompt)
        want = [p[t].logprob for t, p in zip(ids[1:], expected.prompt_logprobs[1:], strict=True)]
        assert c.logprobs.token_logprobs[1 : len(ids)] == pytest.approx(want, abs=1e-6)
        assert len(c.logprobs.token_logprobs) == len(ids) + 3
    streamed = list(
        client(url).completions.create(
            model="tiny", prompt=prompts, n=2, max_tokens=0, echo=True, stream=True
        )
    )
    assert sorted((c.choices[0].index, c.choices[0].text) for c in streamed) == [
        (i, prompts[i // 2]) for i in range(4)
    ]


def test_echo_with_a_constraint_and_a_stop_string(url):
    r = client(url).completions.create(
        model="tiny", prompt="Answer:", max_tokens=8, echo=True, logprobs=1,
        extra_body={"guided_choice": ["yes", "no"]},
    )  # fmt: skip
    assert r.choices[0].text in ("Answer:yes", "Answer:no")
    whole = (
        client(url)
        .completions.create(
            model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    assert whole, "the stop string is taken from the text"
    stop = whole[len(whole) // 2 :]
    cut = client(url).completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, echo=True, stop=[stop],
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert cut.choices[0].text == PROMPT + whole[: whole.index(stop)]
