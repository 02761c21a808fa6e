"""vLLM's request fields that clients of `vllm serve` send: prompt_logprobs, chat's echo,
return_tokens_as_token_ids, cache_salt, both max-token spellings, and an empty tool list. Offline
`generate` is the oracle where there is one."""

import json

import httpx
import pytest
from serve_helpers import engine, metric, running, wait_until

from fastpath.runtime import SamplingParams

PROMPT = "The quick brown fox jumps"
USER = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def _post(url, route, body):
    return httpx.post(f"{url}/v1/{route}", json={"model": "tiny", **body}, timeout=60)


def _offline_prompt_logprobs(llm, prompt, k):
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k)
    return llm.generate([prompt], params, use_tqdm=False)[0]


def _assert_vllms_prompt_logprobs(got, expected):
    """vLLM's JSON: per prompt token None (the first) or {token id: {logprob, rank, decoded_token}}."""
    assert len(got) == len(expected.prompt_token_ids) and got[0] is None
    for token, position, want in zip(
        expected.prompt_token_ids[1:], got[1:], expected.prompt_logprobs[1:], strict=True
    ):
        assert str(token) in position, "the prompt's own token is always listed"
        assert set(position) == {str(t) for t in want}
        for t, e in want.items():
            entry = position[str(t)]
            assert entry["logprob"] == pytest.approx(e.logprob, abs=1e-5)
            assert (entry["rank"], entry["decoded_token"]) == (e.rank, e.decoded_token)


def test_completions_return_prompt_logprobs_in_each_choice(url, llm):
    r = _post(url, "completions", {"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 2, "n": 2})
    assert r.status_code == 200, r.text
    expected = _offline_prompt_logprobs(llm, PROMPT, 2)
    for choice in r.json()["choices"]:
        _assert_vllms_prompt_logprobs(choice["prompt_logprobs"], expected)
    plain = _post(url, "completions", {"prompt": PROMPT, "max_tokens": 2})
    assert "prompt_logprobs" not in plain.json()["choices"][0], "only where asked"


def test_chat_returns_prompt_logprobs_beside_the_choices(url, llm):
    r = _post(url, "chat/completions", {"messages": USER, "max_tokens": 2, "prompt_logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    rendered = llm.render_chat(USER)
    expected = _offline_prompt_logprobs(llm, {"prompt_token_ids": rendered["prompt_token_ids"]}, 0)
    _assert_vllms_prompt_logprobs(body["prompt_logprobs"], expected)


def test_an_echo_and_prompt_logprobs_each_list_their_own_top_k(url, llm):
    """The engine computes the larger top k once; each part lists as many as it asked for."""
    for k, echo_k in ((1, 3), (3, 1)):
        body = {
            "prompt": PROMPT,
            "max_tokens": 1,
            "echo": True,
            "logprobs": echo_k,
            "prompt_logprobs": k,
            "return_tokens_as_token_ids": True,
        }  # fmt: skip  (keys that two tokens cannot share)
        choice = _post(url, "completions", body).json()["choices"][0]
        ids = llm.get_tokenizer()(PROMPT)["input_ids"]
        for token, position in zip(ids[1:], choice["prompt_logprobs"][1:], strict=True):
            ranked = [e for t, e in position.items() if t != str(token) or e["rank"] <= k]
            assert len(ranked) == k and all(e["rank"] <= k for e in ranked), position
        for top in choice["logprobs"]["top_logprobs"][1 : len(ids)]:
            assert echo_k <= len(top) <= echo_k + 1, "the echo's top k, and the prompt's token"


@pytest.mark.parametrize(
    ("route", "body", "param", "words"),
    [
        ("completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "not available with stream"),
        ("chat/completions", {"messages": USER, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "not available with stream"),
        ("completions", {"prompt": PROMPT, "prompt_logprobs": -1}, "prompt_logprobs", "int in [0, 20]"),
        ("chat/completions", {"messages": USER, "prompt_logprobs": 21}, "prompt_logprobs", "int in [0, 20]"),
        ("completions", {"prompt": PROMPT, "cache_salt": ""}, "cache_salt", "non-empty"),
        ("responses", {"input": "hi", "cache_salt": ""}, "cache_salt", "non-empty"),
        ("completions", {"prompt": PROMPT, "use_beam_search": True, "n": 2, "prompt_logprobs": 1}, "prompt_logprobs", "use_beam_search"),
    ],
)  # fmt: skip
def test_bad_values_are_400s_naming_the_field(url, route, body, param, words):
    r = _post(url, route, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["param"] == param, error


def test_chat_echo_puts_the_last_message_before_the_reply(url):
    messages = [*USER, {"role": "assistant", "content": "Hello"}]
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "add_generation_prompt": False, "continue_final_message": True}  # fmt: skip
    plain = _post(url, "chat/completions", body).json()["choices"][0]["message"]["content"]
    echoed = _post(url, "chat/completions", {**body, "echo": True}).json()["choices"][0]["message"]["content"]
    assert echoed == "Hello" + plain
    streamed = {"model": "tiny", **body, "echo": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=streamed, timeout=60) as r:
        text = "".join(_delta(line) for line in r.iter_lines() if line.startswith("data: {"))
    assert text == echoed, "a stream sends the echo in its opening chunk"
    # With a generation prompt the reply is the assistant's: a user's last message is not echoed.
    fresh = _post(
        url, "chat/completions", {"messages": USER, "max_tokens": 3, "temperature": 0, "echo": True}
    )
    alone = _post(url, "chat/completions", {"messages": USER, "max_tokens": 3, "temperature": 0})
    assert fresh.json()["choices"][0]["message"] == alone.json()["choices"][0]["message"]


def _delta(line: str) -> str:
    choices = json.loads(line[len("data: ") :])["choices"]
    return "".join(c["delta"].get("content") or "" for c in choices)


def test_tokens_as_token_ids_tell_apart_what_text_cannot(url, llm):
    ids = llm.get_tokenizer()(PROMPT)["input_ids"]
    r = _post(url, "completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2,
                                   "return_tokens_as_token_ids": True, "return_token_ids": True,
                                   "echo": True})  # fmt: skip
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in ids + choice["token_ids"]]
    assert all(k.startswith("token_id:") for top in lp["top_logprobs"][1:] for k in top)
    text = _post(url, "completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2,
                                      "echo": True}).json()["choices"][0]["logprobs"]  # fmt: skip
    assert lp["text_offset"] == text["text_offset"], "offsets stay those of the text"
    chat = _post(url, "chat/completions", {"messages": USER, "max_tokens": 3, "temperature": 0, "logprobs": True,
                                           "top_logprobs": 2, "return_tokens_as_token_ids": True,
                                           "return_token_ids": True}).json()["choices"][0]  # fmt: skip
    content = chat["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in chat["token_ids"]]
    assert all(bytes(c["bytes"]).decode() == c["token"] for c in content)
    assert all(t["token"].startswith("token_id:") for c in content for t in c["top_logprobs"])


def test_max_completion_tokens_wins_over_max_tokens(url):
    r = _post(url, "chat/completions", {"messages": USER, "max_tokens": 1, "max_completion_tokens": 3,
                                        "ignore_eos": True})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_an_empty_tool_list_calls_nothing(url, choice):
    """As OpenAI and vLLM: clients that build the tool list per turn may send it empty."""
    r = _post(
        url, "chat/completions", {"messages": USER, "max_tokens": 3, "tools": [], "tool_choice": choice}
    )
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert not message.get("tool_calls") and isinstance(message["content"], str)


def test_cache_salt_keeps_a_tenants_prompts_to_itself(tiny_text_checkpoint):
    system = "You are a terse assistant who answers in one word. " * 6
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]

    def cached(url, route, **extra):
        body = {"max_tokens": 2, "temperature": 0, **extra}
        body |= {"messages": messages} if route == "chat/completions" else {"prompt": system}
        r = _post(url, route, body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    with engine(tiny_text_checkpoint, enable_prefix_caching=True) as llm, running(llm) as url:
        for route in ("chat/completions", "completions"):
            assert cached(url, route, cache_salt=f"a-{route}") == 0
            assert cached(url, route, cache_salt=f"b-{route}") == 0, "another tenant finds nothing"
            assert cached(url, route, cache_salt=f"a-{route}") > 0, "the same tenant finds its own"
        hits = metric(url, "vllm:prefix_cache_hits_total")
        assert hits > 0


def test_token_histograms_count_each_finished_completion(url):
    before = metric(url, "vllm:request_generation_tokens_count")
    prompt_sum = metric(url, "vllm:request_prompt_tokens_sum")
    r = _post(url, "completions", {"prompt": PROMPT, "max_tokens": 3, "n": 2, "ignore_eos": True})
    assert r.status_code == 200, r.text
    # Recorded as the request closes, which may come just after its response.
    wait_until(lambda: metric(url, "vllm:request_generation_tokens_count") == before + 2, 10, "the histogram")
    assert (
        metric(url, "vllm:request_prompt_tokens_sum") == prompt_sum + 2 * r.json()["usage"]["prompt_tokens"]
    )


def test_server_wide_template_keys_and_docs_switch(tiny_text_checkpoint):
    """vLLM's --chat-template renders every chat (and /tokenize's); any of several --api-key keys opens
    the routes; --disable-fastapi-docs takes /docs and /openapi.json away; --return-tokens-as-token-ids
    is the default a request may override."""
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    config = {"api_key": ("k1", "k2"), "chat_template": template, "fastapi_docs": False,
              "return_tokens_as_token_ids": True}  # fmt: skip
    with engine(tiny_text_checkpoint) as llm, running(llm, **config) as url:
        for key in ("k1", "k2"):
            auth = {"Authorization": f"Bearer {key}"}
            r = httpx.post(f"{url}/tokenize", json={"model": "tiny", "messages": USER}, headers=auth)
            assert r.status_code == 200, r.text
            want = llm.get_tokenizer()("[user]Say hi.", add_special_tokens=False)["input_ids"]
            assert r.json()["tokens"] == want
        wrong = httpx.post(f"{url}/tokenize", json={"prompt": "x"}, headers={"Authorization": "Bearer k3"})
        assert wrong.status_code == 401
        assert httpx.get(f"{url}/docs").status_code == 404
        assert httpx.get(f"{url}/openapi.json").status_code == 404
        for own, spelled in ((None, True), (False, False)):  # the server's default, then the request's
            body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "logprobs": 1}
            if own is not None:
                body["return_tokens_as_token_ids"] = own
            r = httpx.post(f"{url}/v1/completions", json=body, headers=auth)
            tokens = r.json()["choices"][0]["logprobs"]["tokens"]
            assert all(t.startswith("token_id:") for t in tokens) is spelled, tokens


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_prompt_logprobs_0_with_a_stream_is_taken_and_streams_none(url, route):
    """vLLM refuses only k > 0 with a stream; 0 asks for nothing a stream could carry."""
    body = {"prompt": PROMPT} if route == "completions" else {"messages": USER}
    body |= {"max_tokens": 2, "prompt_logprobs": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/{route}", json={"model": "tiny", **body}, timeout=60) as r:
        assert r.status_code == 200
        text = r.read().decode()
    assert text.rstrip().endswith("data: [DONE]") and "prompt_logprobs" not in text
