"""Bad requests get 400 with an OpenAI error body naming the field; auth, size and model errors likewise."""

import json

import httpx
import openai
import pytest
from serve_helpers import client, running

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
NAMED_G = {"type": "function", "function": {"name": "g"}}


@pytest.fixture(scope="module")
def url(llm):
    with running(llm, max_tokens=64, max_request_bytes=4096, api_key="sesame") as url:
        yield url


@pytest.fixture
def http(url):
    with httpx.Client(base_url=url, timeout=30, headers={"Authorization": "Bearer sesame"}) as http:
        yield http


def _nested(depth: int) -> dict:
    value: dict = {"a": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


BAD = [
    # (route body, changes, the param the error names, words in its message)
    (COMPLETION, {"temperature": -1}, "temperature", ">= 0"),
    (COMPLETION, {"top_p": 5}, "top_p", "(0, 1]"),
    (COMPLETION, {"n": 0}, "n", "[1, 256]"),
    (COMPLETION, {"max_tokens": 0}, "max_tokens", "max_tokens"),
    (COMPLETION, {"max_tokens": 65}, "max_tokens", "limit of 64"),
    (COMPLETION, {"logprobs": 50}, "logprobs", "[0, 20]"),
    (COMPLETION, {"presence_penalty": 3}, "presence_penalty", "[-2, 2]"),
    (COMPLETION, {"top_k": -2}, "top_k", "top_k"),
    (COMPLETION, {"min_p": 1.5}, "min_p", "[0, 1]"),
    (COMPLETION, {"repetition_penalty": 0}, "repetition_penalty", "(0, 100]"),
    (COMPLETION, {"seed": -(2**63) - 1}, "seed", "int64"),
    (COMPLETION, {"stop": [""]}, "stop", "non-empty"),
    (COMPLETION, {"min_tokens": 5}, "min_tokens", "must not exceed"),
    (COMPLETION, {"temperature": "hot"}, "temperature", "valid number"),
    (COMPLETION, {"n": True}, "n", "valid integer"),
    (COMPLETION, {"prompt": []}, "prompt", "empty list"),
    (COMPLETION, {"prompt": [[1, 2], []]}, "prompt", "empty prompt"),
    (COMPLETION, {"prompt": [1, 99999]}, "prompt", "out of range"),
    (COMPLETION, {"stop_token_ids": [99999]}, "stop_token_ids", "out of range"),
    (COMPLETION, {"temprature": 1}, "temprature", "did you mean 'temperature'"),
    (COMPLETION, {"prompt": [1, True]}, "prompt", "a list of token ids"),
    (COMPLETION, {"stop": 5}, "stop", "a string or a list of strings"),
    (
        COMPLETION,
        {"structured_outputs": {"regex": "a+", "choice": ["a"]}},
        "structured_outputs",
        "exactly one",
    ),
    (COMPLETION, {"structured_outputs": {}}, "structured_outputs", "no constraint"),
    (COMPLETION, {"structured_outputs": {"regx": "a"}}, "structured_outputs.regx", "did you mean 'regex'"),
    (COMPLETION, {"echo": True, "max_tokens": -1}, "max_tokens", "an int in [1, "),
    (COMPLETION, {"logit_bias": {"five": 1}}, "logit_bias", "keyed by token ids"),
    (COMPLETION, {"logit_bias": {"99999": 1}}, "logit_bias", "out of range"),
    (CHAT, {"allowed_token_ids": [5, 99999]}, "allowed_token_ids", "out of range"),
    (CHAT, {"allowed_token_ids": []}, "allowed_token_ids", "1 to 1024"),
    (COMPLETION, {"bad_words": [""]}, "bad_words", "non-blank"),
    (COMPLETION, {"stream_options": {"include_usage": True}}, "stream_options", "stream: true"),
    (COMPLETION, {"guided_regex": "[a-z]+", "guided_choice": ["a"]}, "guided_regex", "set one"),
    (COMPLETION, {"guided_choice": []}, "guided_choice", "non-empty"),
    (COMPLETION, {"guided_json": _nested(500)}, "guided_json", "nests deeper than 64"),
    (COMPLETION, {"max_tokens": None, "min_tokens": 1 << 63}, "min_tokens", "[0, 2147483647]"),
    (COMPLETION, {"guided_regex": "([a-z"}, "guided_regex", "regex"),
    (
        CHAT,
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
        "response_format",
        "",
    ),
    (COMPLETION, {"prompt": "hi " * 600}, "prompt", "max_seq_len"),
    (CHAT, {"messages": []}, "messages", "at least 1"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role", "system"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages.0.content.0.type",
        "'text'",
    ),
    (CHAT, {"max_tokens": None, "max_completion_tokens": 0}, "max_completion_tokens", "[1, "),
    (CHAT, {"top_logprobs": 2}, "top_logprobs", "logprobs: true"),
    (CHAT, {"chat_template": "{{ 'x' * 9 }}"}, "chat_template", "--trust-request-chat-template"),
    (
        CHAT,
        {"chat_template_kwargs": {"return_tensors": "np"}},
        "chat_template_kwargs",
        "'return_tensors' is an",
    ),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    (CHAT, {"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    (CHAT, {"response_format": {"type": "yaml"}}, "response_format.type", "json_object"),
    (CHAT, {"tools": [{"type": "function"}]}, "tools.0.function", "required"),
    (CHAT, {"tools": [{"type": "code", "function": {"name": "f"}}]}, "tools.0.type", "'function'"),
    (
        CHAT,
        {"tools": [{"type": "function", "function": {"name": "f g"}}]},
        "tools.0.function.name",
        "pattern",
    ),
    (CHAT, {"tools": [TOOL]}, "tool_choice", "--enable-auto-tool-choice"),
    (CHAT, {"tools": [TOOL], "tool_choice": "auto"}, "tool_choice", "--tool-call-parser"),
    (CHAT, {"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "'required'"),
    (CHAT, {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", "needs tools"),
    (
        CHAT,
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {}}},
        "tool_choice.function.name",
        "required",
    ),
    (
        CHAT,
        {"tools": [TOOL], "tool_choice": {"type": "function", "name": "f"}},
        "tool_choice.function",
        "required",
    ),
    (CHAT, {"tools": [TOOL], "tool_choice": NAMED_G}, "tool_choice", "'g', which is not one of the tools"),
    (CHAT, {"tools": [TOOL], "tool_choice": "required", "use_beam_search": True}, "use_beam_search", "beam"),
    (
        CHAT,
        {"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
        "already holds the output to the tools' schemas",
    ),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "a list of text parts"),
]


@pytest.mark.parametrize(("base", "change", "param", "words"), BAD, ids=[f"{b[2]}" for b in BAD])
def test_a_bad_field_gets_400_naming_it(http, base, change, param, words):
    route = "/v1/chat/completions" if "messages" in base else "/v1/completions"
    r = http.post(route, json={**base, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert words in error["message"]
    assert "SamplingParams" not in error["message"], "the message speaks the client's words"


def test_the_openai_client_sees_a_bad_request_error(url):
    with pytest.raises(openai.BadRequestError) as info:
        client(url, "sesame").completions.create(model="tiny", prompt="hi", top_p=7)
    assert info.value.body["param"] == "top_p"


@pytest.mark.parametrize("base", [COMPLETION, CHAT], ids=["completions", "chat"])
def test_explicit_nulls_take_the_defaults_as_openai_documents(http, base):
    route = "/v1/chat/completions" if "messages" in base else "/v1/completions"
    nulls = dict.fromkeys(
        ["n", "logprobs", "presence_penalty", "frequency_penalty", "stream", "temperature", "seed"]
    )
    response = http.post(route, json={**base, **nulls})
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 1


@pytest.mark.parametrize(
    ("content", "content_type", "words"),
    [
        (b"{not json", "application/json", "not valid JSON at character 1"),
        (b"", "application/json", "the body is empty"),
        (b"[1, 2]", "application/json", "must be a JSON object"),
        (b"prompt=hi", "application/x-www-form-urlencoded", "must be a JSON object"),
    ],
    ids=["malformed", "empty", "array", "form"],
)
def test_a_body_that_is_not_a_json_object_gets_400_saying_so(http, content, content_type, words):
    r = http.post("/v1/completions", content=content, headers={"content-type": content_type})
    assert r.status_code == 400
    assert words in r.json()["error"]["message"] and r.json()["error"]["param"] is None


def test_fields_this_server_does_not_use_are_ignored_and_misspellings_are_not(http):
    # Newer OpenAI fields, vLLM extras it does not implement, and a client's round-tripped reply.
    extra = {"store": False, "metadata": {"a": "b"}, "service_tier": "auto", "priority": 0}
    assert http.post("/v1/completions", json={**COMPLETION, **extra}).status_code == 200
    # Chat's top_logprobs sent to completions (as clients that share one set of options do) is no
    # misspelling of completions' logprobs: ignored, as vLLM ignores it.
    r = http.post("/v1/completions", json={**COMPLETION, "top_logprobs": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None, r.text
    reply = {"role": "assistant", "content": "hello", "refusal": None, "annotations": [], "tool_calls": None}
    messages = [{"role": "user", "content": "hi"}, reply, {"role": "user", "content": "again"}]
    r = http.post("/v1/chat/completions", json={**CHAT, "messages": messages, "prompt_cache_key": "k"})
    assert r.status_code == 200, r.text
    r = http.post("/v1/chat/completions", json={**CHAT, "max_tokns": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokns"
    assert "did you mean 'max_tokens'" in r.json()["error"]["message"]


def test_a_wrong_method_is_405_typed_as_the_clients_error(http):
    r = http.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


def test_the_default_max_tokens_fits_under_the_limit(llm):
    with running(llm, max_tokens=5) as url:
        r = client(url).completions.create(model="tiny", prompt="hi", extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 5  # completions' default, 16, capped by the server's limit
        chat = client(url).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], extra_body={"ignore_eos": True}
        )
        assert chat.usage.completion_tokens == 5  # chat's default: the limit


def test_an_unknown_model_gets_404(http):
    r = http.post("/v1/completions", json={**COMPLETION, "model": "gpt-9"})
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "model"


def test_a_body_over_the_size_limit_gets_413(http, url):
    big = {**COMPLETION, "prompt": "x" * 5000}
    assert http.post("/v1/completions", json=big).status_code == 413

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        yield b'{"prompt": "'
        yield b"x" * 5000
        yield b'"}'

    r = http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "4096" in r.json()["error"]["message"]


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic sesame", "Bearer sesame2", "Bearer"])
def test_a_missing_or_wrong_api_key_gets_401(url, header):
    headers = {"Authorization": header} if header else {}
    r = httpx.post(f"{url}/v1/completions", json=COMPLETION, headers=headers, timeout=30)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{url}/v1/models", headers=headers, timeout=30).status_code == 401


def test_the_right_key_passes_and_health_and_metrics_need_none(url):
    with pytest.raises(openai.AuthenticationError):
        client(url, "wrong").models.list()
    assert [m.id for m in client(url, "sesame").models.list().data] == ["tiny"]
    assert httpx.get(f"{url}/health", timeout=30).json() == {"status": "ok"}
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == 200


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"prompt": "\ud800"}, "prompt", "cannot encode"),
        ({"messages": [{"role": "user", "content": "hi"}], "chat_template": "x"}, "chat_template", "--trust"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"padding": True}},
            "chat_template_kwargs",
            "'padding'",
        ),
    ],
    ids=["surrogate", "template", "tokenizer-argument"],
)
def test_tokenize_refuses_what_the_routes_refuse_with_400(http, body, param, words):
    content = json.dumps(body).encode()  # ASCII with \u escapes: a lone surrogate is valid JSON text
    r = http.post("/tokenize", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


def test_unknown_keys_are_spell_checked_a_bounded_number_of_times(monkeypatch):
    from fastpath.runtime.serve import protocol

    calls = []
    real = protocol.misspelling_of
    monkeypatch.setattr(protocol, "misspelling_of", lambda *a: calls.append(a) or real(*a))
    body = {"prompt": "hi", **{f"k{i:06d}": 0 for i in range(2000)}}
    assert protocol.CompletionRequest.model_validate(body).prompt == "hi"
    assert 0 < len(calls) <= 32


def test_a_history_with_an_assistants_refusal_and_a_function_result_is_accepted(http):
    """What OpenAI returns, sent back in the next request's history, as clients do."""
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot help with that."}]},
        {"role": "function", "name": "lookup", "content": "42"},
        {"role": "user", "content": "again"},
    ]
    r = http.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert r.status_code == 200, r.text
    rendered = http.post("/tokenize", json={"model": "tiny", "messages": messages[:2]}).json()
    text = http.post("/detokenize", json={"model": "tiny", "tokens": rendered["tokens"]}).json()["prompt"]
    assert "I cannot help with that." in text
