"""The OpenAI routes through the official client: models, completions and chat, streamed and not."""

import json
import logging
import time

import httpx
import openai
import pytest
from serve_helpers import client, running

from fastpath.runtime import SamplingParams

PROMPTS = ["The quick brown fox", "Decode steps replay", '{"name": "fastpath"']
TOKENS = {"return_token_ids": True, "ignore_eos": True}


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def _offline(llm, prompt, max_tokens, **kw):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **{"temperature": 0.0, **kw})
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]


def test_models_names_the_served_model(url, llm):
    (model,) = client(url).models.list().data
    assert model.id == "tiny"
    assert model.owned_by == "fastpath"
    assert model.max_model_len == llm.config.max_seq_len


def test_each_served_names_card_has_the_started_model_as_its_root_and_vllms_permission(llm):
    """vLLM's cards: `root` is the model the server was started with under every served name (tools
    find the checkpoint behind an alias there), and a model_permission list."""
    with running(llm, served_model_name=("alpha", "beta")) as url:
        cards = client(url).models.list().data
    assert [(c.id, c.model_extra["root"]) for c in cards] == [("alpha", "tiny"), ("beta", "tiny")]
    (permission,) = cards[0].model_extra["permission"]
    assert permission["object"] == "model_permission" and permission["allow_sampling"] is True


def test_a_model_is_retrieved_by_name_and_another_is_404(url):
    assert client(url).models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client(url).models.retrieve("acme/other-model")


def test_greedy_completion_equals_offline_generate(url, llm):
    for prompt in PROMPTS:
        r = client(url).completions.create(
            model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body=TOKENS
        )
        expected = _offline(llm, prompt, 12)
        (choice,) = r.choices
        assert choice.token_ids == expected.token_ids
        assert choice.text == expected.text
        assert choice.finish_reason == "length"
        assert r.usage.completion_tokens == 12
        assert r.usage.prompt_tokens == len(llm.get_tokenizer()(prompt)["input_ids"])
        assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_streamed_completion_equals_the_whole_one(url, llm):
    chunks = list(
        client(url).completions.create(
            model="tiny",
            prompt=PROMPTS[0],
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=TOKENS,
        )
    )
    expected = _offline(llm, PROMPTS[0], 10)
    body = [c for c in chunks if c.choices]
    assert len(body) > 1, "a stream sends tokens as steps complete, not all at the end"
    assert "".join(c.choices[0].text for c in body) == expected.text
    assert [t for c in body for t in c.choices[0].token_ids] == expected.token_ids
    assert body[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in body)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_continuous_usage_stats_give_every_chunk_the_counts_so_far(url, route):
    options = {"include_usage": True, "continuous_usage_stats": True}
    api = client(url)
    if route == "completions":
        stream = api.completions.create(
            model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0, stream=True,
            stream_options=options, extra_body=TOKENS,
        )  # fmt: skip
    else:
        stream = api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0,
            stream=True, stream_options=options, extra_body={"ignore_eos": True},
        )  # fmt: skip
    chunks = list(stream)
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 8
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 8


def test_continuous_usage_counts_each_choice_and_its_own_prompt(url, llm):
    """vLLM's shape: a chunk's usage is its own choice's, with its own prompt's tokens."""
    prompts = [PROMPTS[0], PROMPTS[1] + " and more words"]
    chunks = list(
        client(url).completions.create(
            model="tiny", prompt=prompts, n=2, max_tokens=5, temperature=0, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body=TOKENS,
        )
    )  # fmt: skip
    lengths = [len(llm.get_tokenizer()(p)["input_ids"]) for p in prompts]
    seen: dict[int, int] = {}
    for c in chunks[:-1]:
        (choice,) = c.choices
        seen[choice.index] = seen.get(choice.index, 0) + len(choice.token_ids)
        assert c.usage.completion_tokens == seen[choice.index]
        assert c.usage.prompt_tokens == lengths[choice.index // 2]
    assert seen == {0: 5, 1: 5, 2: 5, 3: 5}
    assert chunks[-1].usage.completion_tokens == 20 and chunks[-1].usage.prompt_tokens == sum(lengths)


def test_token_id_prompts_and_several_prompts_in_one_request(url, llm):
    tok = llm.get_tokenizer()
    ids = [tok(p)["input_ids"] for p in PROMPTS[1:]]
    for prompt in (ids, PROMPTS[1:]):
        r = client(url).completions.create(
            model="tiny", prompt=prompt, max_tokens=6, temperature=0, n=2, extra_body=TOKENS
        )
        assert [c.index for c in r.choices] == [0, 1, 2, 3]
        assert r.choices[0].token_ids == r.choices[1].token_ids == _offline(llm, ids[0], 6).token_ids
        assert r.choices[2].token_ids == _offline(llm, ids[1], 6).token_ids
        assert r.usage.completion_tokens == 24
        assert r.usage.prompt_tokens == len(ids[0]) + len(ids[1])


def test_chat_uses_the_template_and_equals_offline_chat(url, llm):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    r = client(url).chat.completions.create(
        model="tiny", messages=messages, max_tokens=9, temperature=0, extra_body=TOKENS
    )
    expected = llm.chat(
        messages, SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True), use_tqdm=False
    )[0]
    (choice,) = r.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.outputs[0].text
    assert choice.token_ids == expected.outputs[0].token_ids
    assert r.prompt_token_ids == expected.prompt_token_ids
    assert r.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert r.object == "chat.completion"


def test_streamed_chat_sends_the_role_first_then_content(url, llm):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]}
    ]
    stream = client(url).chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True, extra_body=TOKENS
    )
    chunks = list(stream)
    expected = llm.chat(
        [{"role": "user", "content": "hello\nthere"}],  # parts joined as vLLM joins them
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[0].object == "chat.completion.chunk"


def test_seeded_sampling_is_reproducible_and_n_completions_differ(url):
    def sample():
        return client(url).completions.create(
            model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=7, n=3, extra_body=TOKENS
        )

    first, second = sample(), sample()
    assert [c.token_ids for c in first.choices] == [c.token_ids for c in second.choices]
    assert len({tuple(c.token_ids) for c in first.choices}) > 1


def test_stop_strings_end_the_text(url, llm):
    full = _offline(llm, PROMPTS[0], 16).text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    r = client(url).completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=16,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_logprobs_in_both_shapes(url):
    # The shapes only: what the top-k holds is the sampler's to test.
    r = client(url).completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=3, extra_body=TOKENS
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    # A last character the four tokens leave unfinished is in the token strings (as U+FFFD), not the text.
    assert "".join(lp.tokens).rstrip("\ufffd") == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0
        assert top[token] == logprob and 1 <= len(top) <= 4

    chat = client(url).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    assert "".join(t.token for t in content).rstrip("\ufffd") == chat.choices[0].message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)
    assert all(bytes(t.bytes) == t.token.encode() for t in content)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_top_logprobs_lists_exactly_k_alternatives_even_when_the_sampled_token_is_not_one(url, stream):
    """Sampled at a high temperature, most tokens are outside the top 2: OpenAI and vLLM still list
    exactly 2 (and none without top_logprobs), the sampled token only where it is one of them."""
    for top in (2, None):
        kw = {"top_logprobs": top} if top is not None else {}
        reply = client(url).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=24,
            temperature=5.0,
            seed=3,
            logprobs=True,
            stream=stream,
            extra_body={"ignore_eos": True},
            **kw,
        )
        chunks = list(reply) if stream else [reply]
        content = [
            t for c in chunks for choice in c.choices if choice.logprobs for t in choice.logprobs.content
        ]
        assert len(content) == 24
        outside = 0
        for t in content:
            assert len(t.top_logprobs) == (top or 0), (top, t)
            ranked = [a.logprob for a in t.top_logprobs]
            assert ranked == sorted(ranked, reverse=True)
            outside += bool(top) and t.token not in {a.token for a in t.top_logprobs}
        assert top is None or outside > 0  # the case this test is about did happen


def test_a_stream_interval_gathers_tokens_per_event_and_loses_none(llm):
    # The engine steps faster than the client reads, so events may gather even more than 4.
    with running(llm, stream_interval=4) as url:
        chunks = list(
            client(url).completions.create(
                model="tiny", prompt=PROMPTS[1], max_tokens=13, temperature=0, stream=True, extra_body=TOKENS
            )
        )
    expected = _offline(llm, PROMPTS[1], 13)
    sizes = [len(c.choices[0].token_ids) for c in chunks if c.choices and c.choices[0].token_ids]
    assert [t for c in chunks if c.choices for t in c.choices[0].token_ids] == expected.token_ids
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert sizes[0] >= 1 and all(n >= 4 for n in sizes[1:-1]), sizes  # the first goes at once
    assert len(sizes) <= 1 + -(-12 // 4), sizes


def test_a_stream_interval_outside_its_range_is_refused():
    from fastpath.runtime.serve.config import ServeConfig

    with pytest.raises(ValueError, match="stream_interval"):
        ServeConfig(stream_interval=0)


def _finished_total(url) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("fastpath_request_finished_total{")
    )


def test_n_choices_each_finish_once_in_a_stream_and_in_the_metrics(url):
    # Stop ids that end some choices early, so finished choices sit beside running ones.
    extra = {"stop_token_ids": list(range(3, 300, 7)), "ignore_eos": True}
    kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=1.0, seed=5, n=4, extra_body=extra)
    before = _finished_total(url)
    whole = client(url).completions.create(**kw)
    assert _finished_total(url) - before == 4
    assert len({len(c.text) for c in whole.choices}) > 1, "the choices end at different steps"
    finishes: dict[int, list[str]] = {}
    for chunk in client(url).completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.finish_reason is not None:
                finishes.setdefault(c.index, []).append(c.finish_reason)
    assert finishes == {c.index: [c.finish_reason] for c in whole.choices}
    assert _finished_total(url) - before == 8


def test_max_tokens_beyond_the_context_is_a_400_and_null_means_the_rest_of_it(url, llm):
    room = 12
    prompt = [5] * (llm.config.max_seq_len - room)
    http = httpx.Client(base_url=url, timeout=60)
    body = {"model": "tiny", "prompt": prompt, "ignore_eos": True}
    r = http.post("/v1/completions", json={**body, "max_tokens": room + 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert f"({room + 1} > {llm.config.max_seq_len} - {len(prompt)})" in r.json()["error"]["message"]
    assert http.post("/v1/completions", json={**body, "max_tokens": room}).status_code == 200
    whole = http.post("/v1/completions", json={**body, "max_tokens": None}).json()
    assert whole["usage"]["completion_tokens"] == room and whole["choices"][0]["finish_reason"] == "length"
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**6}
    r = http.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"


def test_structured_outputs_is_vllms_newer_spelling_of_guided_decoding(url):
    r = client(url).completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=8,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert r.choices[0].text in ("yes", "no")


def test_tools_with_tool_choice_none_reach_the_chat_template(llm):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    template = "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}{{ messages[-1].content }}"
    messages = [{"role": "user", "content": "hi"}]
    with running(llm, trust_request_chat_template=True) as url:
        r = client(url).chat.completions.create(
            model="tiny", messages=messages, max_tokens=2, tools=tools, tool_choice="none",
            extra_body={"chat_template": template, "return_token_ids": True},
        )  # fmt: skip
    assert r.prompt_token_ids == llm.get_tokenizer()("[add]hi", add_special_tokens=False)["input_ids"]


def test_a_streamed_chat_opens_each_choice_with_its_role_alone(url):
    chunks = list(
        client(url).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, seed=1, stream=True
        )
    )
    openings = chunks[:2]
    assert [(c.choices[0].index, c.choices[0].delta.role, c.choices[0].delta.content) for c in openings] == [
        (0, "assistant", ""),
        (1, "assistant", ""),
    ]
    assert all(c.choices[0].delta.role is None for c in chunks[2:] if c.choices)


def test_ping_and_head_health_answer_as_health_does(url):
    assert httpx.get(f"{url}/ping", timeout=10).json() == {"status": "ok"}
    assert httpx.post(f"{url}/ping", timeout=10).status_code == 200
    assert httpx.head(f"{url}/health", timeout=10).status_code == 200


def test_add_special_tokens_decides_a_text_prompts_bos(url, llm):
    tok = llm.get_tokenizer()
    for add in (True, False):
        r = client(url).completions.create(
            model="tiny", prompt="hello there", max_tokens=1,
            extra_body={"add_special_tokens": add, "return_token_ids": True},
        )  # fmt: skip
        assert r.choices[0].prompt_token_ids == tok("hello there", add_special_tokens=add)["input_ids"]


def test_fields_a_request_leaves_unset_take_the_models_generation_config(tiny_text_checkpoint, tmp_path):
    import json
    import shutil

    from serve_helpers import engine

    folder = tmp_path / "with-defaults"
    shutil.copytree(tiny_text_checkpoint, folder)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 4}))
    with engine(folder, engine_process=False) as llm, running(llm) as url:
        r = client(url).completions.create(model="tiny", prompt=PROMPTS[0], extra_body=TOKENS)
        want = _offline(llm, PROMPTS[0], 4)
        assert r.choices[0].token_ids == want.token_ids  # greedy, and 4 tokens, not completions' 16
        chat = client(url).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], extra_body=TOKENS
        )
        assert chat.usage.completion_tokens == 4


def test_a_chat_without_max_tokens_runs_to_the_end_of_the_context(url, llm):
    r = client(url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=0, extra_body=TOKENS
    )
    assert r.usage.completion_tokens == llm.config.max_seq_len - r.usage.prompt_tokens
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_the_access_log_says_where_a_first_token_waited(llm, caplog, stream):
    def logged():
        records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "fastpath.serve.access"]
        return next((r for r in records if r["path"] == "/v1/completions"), None)

    with running(llm, access_log=True) as base, caplog.at_level(logging.INFO, "fastpath.serve.access"):
        api = client(base)
        out = api.completions.create(model="tiny", prompt="Hello there", max_tokens=4, stream=stream)
        if stream:
            list(out)
        # The line is written once the response has ended, which a client can see a little earlier.
        deadline = time.monotonic() + 10
        while logged() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    line = logged()
    assert line is not None, "no access-log line for /v1/completions"
    assert line["status"] == 200 and line["prompt_tokens"] > 0
    # Arrival to the first batch slot, then to the first token, within the whole request.
    assert 0 <= line["queue_ms"] <= line["ttft_ms"] <= line["duration_ms"]


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_truncate_prompt_tokens_keeps_a_long_prompts_tail_as_vllms_server_does(url, llm, route):
    limit = llm.config.max_seq_len
    http = httpx.Client(base_url=url, timeout=60)
    if route == "completions":
        body = {"model": "tiny", "prompt": [5 + i % 200 for i in range(limit + 50)], "max_tokens": 4}
        path = "/v1/completions"
    else:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi " * limit}], "max_tokens": 4}
        path = "/v1/chat/completions"
    r = http.post(path, json=body)
    assert r.status_code == 400 and "truncate_prompt_tokens" in r.json()["error"]["message"]
    r = http.post(path, json={**body, "truncate_prompt_tokens": 20, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 20 and r.json()["usage"]["completion_tokens"] == 4
    # max_tokens is checked against the prompt as truncation leaves it.
    r = http.post(path, json={**body, "truncate_prompt_tokens": -1, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = http.post(path, json={**body, "truncate_prompt_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_logit_bias_and_vllms_allowed_token_ids_and_bad_words_reach_the_sampler(url, llm):
    plain = _offline(llm, PROMPTS[0], 8)
    favourite = next(t for t in range(100, 400) if t not in plain.token_ids)
    api = client(url)
    biased = api.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0, logit_bias={str(favourite): 100},
        extra_body=TOKENS,
    )  # fmt: skip
    assert biased.choices[0].token_ids == [favourite] * 8
    allowed = [5, 71, 300]
    chat = api.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12, temperature=1.0, seed=3,
        extra_body={**TOKENS, "allowed_token_ids": allowed},
    )  # fmt: skip
    assert set(chat.choices[0].token_ids) <= set(allowed)
    banned = llm.tokenizer.encode("e", add_special_tokens=False)
    assert len(banned) == 1, "the word the test bans is one token"
    words = api.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0,
        logit_bias={str(banned[0]): 50}, extra_body={**TOKENS, "bad_words": ["e"]},
    )  # fmt: skip
    assert banned[0] not in words.choices[0].token_ids, "a ban outweighs any bias"
