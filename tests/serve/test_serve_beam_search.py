"""use_beam_search, vLLM's server option, through the official client: the choices are LLM.beam_search's
beams, best first, for completions and chat, streamed or not; what beams do not use is refused by name."""

import httpx
import openai
import pytest
from serve_helpers import client, metric, running

from fastpath.runtime import BeamSearchParams

PROMPT = "The quick brown fox"
BEAM = {"use_beam_search": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def _offline(llm, prompt_ids, width, max_tokens, length_penalty=1.0):
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, length_penalty=length_penalty)
    (out,) = llm.beam_search([{"prompt_token_ids": prompt_ids}], params)
    return out.sequences


def _check(choices, beams, prompt_len, llm):
    """Each choice is its beam: generated tokens, text without a final EOS, finish reason."""
    tokenizer = llm.get_tokenizer()
    assert len(choices) == len(beams)
    for choice, beam in zip(choices, beams, strict=True):
        tokens = beam.tokens[prompt_len:]
        shown = tokens[:-1] if beam.finish_reason == "stop" else tokens
        assert choice.token_ids == tokens
        assert choice.text == tokenizer.decode(shown)
        assert choice.finish_reason == beam.finish_reason


def _ids(llm, prompt):
    return llm.get_tokenizer()(prompt)["input_ids"]


def test_completion_choices_are_the_offline_beams_best_first(url, llm):
    ids = _ids(llm, PROMPT)
    r = client(url).completions.create(
        model="tiny", prompt=PROMPT, n=3, max_tokens=6, temperature=0, extra_body=BEAM
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    _check(r.choices, _offline(llm, ids, 3, 6), len(ids), llm)
    assert len({tuple(c.token_ids) for c in r.choices}) == 3, "three different beams"
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)


def test_eos_ends_beams_and_the_length_penalty_decides_between_short_and_long(url, llm, monkeypatch):
    """With a token the beams generate made an end-of-sequence token, beams end at different lengths:
    length_penalty 0 prefers the short ones (their EOS left out of the text), 2 the long ones."""
    ids = _ids(llm, PROMPT)
    best = _offline(llm, ids, 3, 6)[0].tokens[len(ids) :]
    monkeypatch.setattr(llm, "eos_ids", frozenset({best[3]}))
    short, long = _offline(llm, ids, 3, 6, 0.0), _offline(llm, ids, 3, 6, 2.0)
    assert [b.finish_reason for b in short] != [b.finish_reason for b in long]
    assert "stop" in {b.finish_reason for b in short}
    for penalty, beams in ((0.0, short), (2.0, long)):
        r = client(url).completions.create(
            model="tiny", prompt=PROMPT, n=3, max_tokens=6, temperature=0,
            extra_body={**BEAM, "length_penalty": penalty},
        )  # fmt: skip
        _check(r.choices, beams, len(ids), llm)


def test_several_prompts_number_their_choices_and_list_the_logprobs_asked_for(url, llm):
    prompts = [PROMPT, "Decode steps replay"]
    r = client(url).completions.create(
        model="tiny", prompt=prompts, n=2, max_tokens=4, temperature=0, logprobs=2, extra_body=BEAM
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for i, prompt in enumerate(prompts):
        ids = _ids(llm, prompt)
        _check(r.choices[2 * i : 2 * i + 2], _offline(llm, ids, 2, 4), len(ids), llm)
    for c in r.choices:
        assert len(c.logprobs.tokens) == 4
        # The two likeliest alternatives, and the beam's own token where it ranks below them.
        assert all(2 <= len(top) <= 3 for top in c.logprobs.top_logprobs)


def test_chat_beams_streamed_equal_the_whole_reply(url, llm):
    messages = [{"role": "user", "content": "Name a colour."}]
    extra = {"use_beam_search": True, "ignore_eos": True}
    whole = client(url).chat.completions.create(
        model="tiny", messages=messages, n=2, max_tokens=5, temperature=0, extra_body=extra,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    chunks = list(
        client(url).chat.completions.create(
            model="tiny", messages=messages, n=2, max_tokens=5, temperature=0, extra_body=extra, stream=True
        )
    )
    streamed, roles, reasons = {}, {}, {}
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
            roles.setdefault(c.index, c.delta.role)
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
    assert roles == {0: "assistant", 1: "assistant"}, "each choice opens with its role"
    assert reasons == {0: "length", 1: "length"}
    assert [streamed[i] for i in range(2)] == [c.message.content for c in whole.choices]
    for c in whole.choices:
        assert c.finish_reason == "length"
        assert len(c.logprobs.content) == 5
        assert all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
    prompt = llm.render_chat(messages)["prompt_token_ids"]
    tokenizer = llm.get_tokenizer()
    want = [tokenizer.decode(b.tokens[len(prompt) :]) for b in _offline(llm, prompt, 2, 5)]
    assert [c.message.content for c in whole.choices] == want


def test_neutral_values_of_unused_fields_pass_as_clients_send_them(url, llm):
    ids = _ids(llm, PROMPT)
    r = client(url).completions.create(
        model="tiny", prompt=PROMPT, n=2, max_tokens=4, temperature=0, top_p=1, seed=3, stop=[],
        logit_bias={}, extra_body={**BEAM, "top_k": -1, "min_p": 0, "repetition_penalty": 1},
    )  # fmt: skip
    _check(r.choices, _offline(llm, ids, 2, 4), len(ids), llm)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": ["x"]}, "stop"),
        ({"top_p": 0.5}, "top_p"),
        ({"extra_body": {"bad_words": ["x"]}}, "bad_words"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
        ({"echo": True}, "echo"),
        ({"n": 11}, "n"),
        ({"n": 2, "logprobs": 5}, "logprobs"),
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


def test_a_length_penalty_that_is_not_finite_is_refused(url):
    body = (
        '{"model": "tiny", "prompt": "Hi", "max_tokens": 2, "use_beam_search": true, "length_penalty": NaN}'
    )
    r = httpx.post(f"{url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "length_penalty", r.text
    assert "finite" in r.json()["error"]["message"]


def test_a_truncated_prompt_is_searched_from_its_last_tokens(url, llm):
    ids = _ids(llm, PROMPT)
    r = client(url).completions.create(
        model="tiny", prompt=PROMPT, n=2, max_tokens=4, temperature=0,
        extra_body={**BEAM, "truncate_prompt_tokens": 3},
    )  # fmt: skip
    assert r.usage.prompt_tokens == 3
    _check(r.choices, _offline(llm, ids[-3:], 2, 4), 3, llm)


def test_a_beam_request_counts_its_first_token_and_its_finishes(url):
    ttft = "fastpath_time_to_first_token_seconds_count"

    def finished() -> float:  # every finish reason's count
        lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
        return sum(
            float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("fastpath_request_finished_total{")
        )

    before = metric(url, ttft), finished()
    client(url).completions.create(
        model="tiny", prompt="Hi", n=2, max_tokens=3, temperature=0, extra_body=BEAM
    )
    assert metric(url, ttft) == before[0] + 1
    assert finished() == before[1] + 2, "one finish per choice"
