"""A server over a prefix-caching engine: usage reports the cached prompt tokens as OpenAI does,
/metrics counts them under vLLM's names, and the tokens are the uncached engine's."""

import pytest
from serve_helpers import client, engine, metric, running

SYSTEM = "You are a terse assistant who answers in one word. " * 6


@pytest.fixture(scope="module")
def urls(tiny_text_checkpoint):
    with (
        engine(tiny_text_checkpoint, enable_prefix_caching=True) as cached,
        running(cached) as url,
        engine(tiny_text_checkpoint) as plain,
        running(plain) as plain_url,
    ):
        yield url, plain_url


def _chat(url, question, **kw):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return client(url).chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}, **kw
    )


def test_a_shared_system_prompt_is_reported_cached_and_changes_no_token(urls):
    url, plain_url = urls
    first = _chat(url, "Name a colour.")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = _chat(url, "Name a fruit.")
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < second.usage.prompt_tokens
    assert second.choices[0].message.content == _chat(plain_url, "Name a fruit.").choices[0].message.content
    assert _chat(plain_url, "Name a fruit.").usage.prompt_tokens_details is None, "no cache: not reported"
    assert metric(url, "vllm:prefix_cache_hits_total") >= cached
    assert (
        metric(url, "vllm:prefix_cache_queries_total")
        >= first.usage.prompt_tokens + second.usage.prompt_tokens
    )


def test_streams_and_completions_report_it_too(urls):
    url, _ = urls
    _chat(url, "Warm the cache.")
    chunks = list(_chat(url, "Name a tree.", stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    api = client(url)
    api.completions.create(model="tiny", prompt=SYSTEM + "z", max_tokens=2)  # not in the chats' template
    # Two prompts admitted in one step: each finds the blocks the earlier request left, not each other's.
    done = api.completions.create(model="tiny", prompt=[SYSTEM + "a", SYSTEM + "b"], max_tokens=2)
    assert done.usage.prompt_tokens_details.cached_tokens >= 2 * 16
