"""vLLM's /tokenize, /detokenize and /version: the served model's own tokenizer and chat template, so
the ids match what the completion routes see."""

import httpx
import pytest
from serve_helpers import running


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30)


def test_tokenize_gives_the_ids_a_completion_prompt_gets(url, llm):
    r = post(url, "/tokenize", {"model": "tiny", "prompt": "The quick brown fox", "return_token_strs": True})
    assert r.status_code == 200
    body = r.json()
    out = llm.generate(["The quick brown fox"], use_tqdm=False)[0]
    assert body["tokens"] == out.prompt_token_ids
    assert body["count"] == len(out.prompt_token_ids)
    assert body["max_model_len"] == llm.config.max_seq_len
    assert body["token_strs"] == llm.get_tokenizer().convert_ids_to_tokens(out.prompt_token_ids)
    bare = post(url, "/tokenize", {"prompt": "The quick brown fox", "add_special_tokens": False}).json()
    assert bare["tokens"] == llm.get_tokenizer()("The quick brown fox", add_special_tokens=False)["input_ids"]


def test_tokenize_renders_a_chat_as_the_chat_route_does(url, llm):
    messages = [{"role": "user", "content": "Hello there"}]
    body = post(url, "/tokenize", {"messages": messages}).json()
    assert body["tokens"] == llm.render_chat(messages)["prompt_token_ids"]
    usage = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "tiny", "messages": messages, "max_tokens": 1},
        timeout=30,
    ).json()["usage"]
    assert usage["prompt_tokens"] == body["count"]
    again = post(url, "/tokenize", {"messages": messages, "add_special_tokens": True}).json()
    rendered = llm.render_chat(messages)["prompt"]
    assert again["tokens"] == llm.get_tokenizer()(rendered, add_special_tokens=True)["input_ids"]


def test_tokenize_renders_tools_as_the_chat_route_does(llm):
    tools = [{"type": "function", "function": {"name": "now"}}]
    template = "{% for t in tools or [] %}<{{ t.function.name }}>{% endfor %}{{ messages[-1].content }}"
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template": template}
    with running(llm, trust_request_chat_template=True) as url:
        tokens = post(url, "/tokenize", {**body, "tools": tools}).json()
        usage = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "tiny", **body, "tools": tools, "tool_choice": "none", "max_tokens": 1},
            timeout=30,
        ).json()["usage"]
    assert tokens["tokens"] == llm.get_tokenizer()("<now>hi", add_special_tokens=False)["input_ids"]
    assert usage["prompt_tokens"] == tokens["count"]


def test_detokenize_inverts_tokenize(url):
    ids = post(url, "/tokenize", {"prompt": "round trip", "add_special_tokens": False}).json()["tokens"]
    assert post(url, "/detokenize", {"tokens": ids}).json() == {"prompt": "round trip"}


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, None, "one of them"),
        ("/tokenize", {}, None, "one of them"),
        ("/tokenize", {"prompt": 5}, "prompt", "valid string"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens", "out of range"),
        ("/detokenize", {"tokens": [-1]}, "tokens.0", "greater than or equal to 0"),
        ("/detokenize", {"tokens": [1], "tokes": 1}, "tokes", "did you mean 'tokens'"),
    ],
)
def test_bad_bodies_get_400_naming_the_field(url, path, body, param, words):
    r = post(url, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_another_model_name_is_404(url):
    assert post(url, "/tokenize", {"model": "other", "prompt": "a"}).status_code == 404


def test_version_names_the_installed_fastpath(url):
    body = httpx.get(f"{url}/version", timeout=10).json()
    assert body["version"] and body["version"] != "unknown"


def test_an_api_key_guards_them_too(llm):
    with running(llm, api_key="sesame") as url:
        assert post(url, "/tokenize", {"prompt": "a"}).status_code == 401
        r = httpx.post(
            f"{url}/tokenize", json={"prompt": "a"}, headers={"Authorization": "Bearer sesame"}, timeout=30
        )
        assert r.status_code == 200
