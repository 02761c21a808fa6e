"""use_beam_search, vLLM's server option, through the official client: the choices are LLM.beam_search's
beams, best first, for completions and chat, streamed or not; what beams do not use is refused by name."""

import openai
import pytest
from serve_helpers import client, running

from fastpath.runtime import BeamSearchParams


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def _offline(llm, prompt_ids, width, max_tokens, length_penalty=1.0):
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, length_penalty=length_penalty)
    (out,) = llm.beam_search([{"prompt_token_ids": prompt_ids}], params)
    return out.sequences


def _generated(beam, prompt_len, eos_ids):
    tokens = beam.tokens[prompt_len:]
    return tokens, tokens[:-1] if beam.finish_reason == "stop" and tokens[-1] in eos_ids else tokens


@pytest.mark.parametrize("length_penalty", [1.0, 0.5])
def test_completion_choices_are_the_offline_beams_best_first(url, llm, length_penalty):
    prompt = "The quick brown fox"
    ids = llm.get_tokenizer()(prompt)["input_ids"]
    r = client(url).completions.create(
        model="tiny", prompt=prompt, n=3, max_tokens=6, temperature=0,
        extra_body={"use_beam_search": True, "length_penalty": length_penalty, "return_token_ids": True},
    )  # fmt: skip
    beams = _offline(llm, ids, 3, 6, length_penalty)
    assert [c.index for c in r.choices] == [0, 1, 2]
    tokenizer = llm.get_tokenizer()
    for choice, beam in zip(r.choices, beams, strict=True):
        tokens, shown = _generated(beam, len(ids), llm.eos_ids)
        assert choice.token_ids == tokens
        assert choice.text == tokenizer.decode(shown)
        assert choice.finish_reason == beam.finish_reason
    assert len({tuple(c.token_ids) for c in r.choices}) == 3, "three different beams"
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)


def test_chat_beams_streamed_equal_the_whole_reply(url, llm):
    messages = [{"role": "user", "content": "Name a colour."}]
    extra = {"use_beam_search": True, "ignore_eos": True}
    whole = client(url).chat.completions.create(
        model="tiny", messages=messages, n=2, max_tokens=5, extra_body=extra, logprobs=True, top_logprobs=2
    )
    chunks = list(
        client(url).chat.completions.create(
            model="tiny", messages=messages, n=2, max_tokens=5, extra_body=extra, stream=True
        )
    )
    streamed = {}
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert [streamed[i] for i in range(2)] == [c.message.content for c in whole.choices]
    for c in whole.choices:
        assert c.finish_reason == "length"
        assert len(c.logprobs.content) == 5
        assert all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
    prompt = llm.render_chat(messages)["prompt_token_ids"]
    beams = _offline(llm, prompt, 2, 5)
    tokenizer = llm.get_tokenizer()
    want = [tokenizer.decode(b.tokens[len(prompt) :]) for b in beams]
    assert [c.message.content for c in whole.choices] == want


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": ["x"]}, "stop"),
        ({"extra_body": {"bad_words": ["x"]}}, "bad_words"),
        ({"seed": 3}, "seed"),
        ({"echo": True}, "echo"),
        ({"n": 11}, "n"),
        ({"extra_body": {"guided_regex": "[a-z]+"}}, "guided_regex"),
    ],
)
def test_what_beams_do_not_use_is_refused_by_name(url, extra, param):
    body = {"use_beam_search": True, **extra.pop("extra_body", {})}
    with pytest.raises(openai.BadRequestError) as err:
        client(url).completions.create(model="tiny", prompt="Hi", max_tokens=3, extra_body=body, **extra)
    assert err.value.body["param"] == param, err.value.body
    r = client(url).completions.create(model="tiny", prompt="Hi", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length", "the server runs on"
