"""OpenAI's /v1/embeddings through the official client: each input's vector is LLM.embed's (itself
held to HF transformers in tests/runtime/test_pooling.py), as floats or base64; bad inputs are 400s
naming the field."""

import base64

import httpx
import numpy as np
import openai
import pytest
from serve_helpers import client, metric, running

from fastpath.runtime import PoolingParams


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


def _offline(llm, inputs, **params):
    return [o.outputs.embedding for o in llm.embed(inputs, PoolingParams(**params), use_tqdm=False)]


def test_texts_and_token_ids_embed_as_the_offline_engine_does(url, llm):
    texts = ["The quick brown fox", "jumps over the lazy dog", "A"]
    r = client(url).embeddings.create(model="tiny", input=texts)
    assert r.model == "tiny" and [d.index for d in r.data] == [0, 1, 2]
    want = _offline(llm, texts)
    for d, w in zip(r.data, want, strict=True):
        np.testing.assert_allclose(d.embedding, w, rtol=1e-6, atol=1e-7)
    ids = [llm.get_tokenizer()(t)["input_ids"] for t in texts]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    one = client(url).embeddings.create(model="tiny", input=ids[0])
    many = client(url).embeddings.create(model="tiny", input=ids)
    np.testing.assert_allclose(one.data[0].embedding, want[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose([d.embedding for d in many.data], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(want[1]), 1.0, rtol=1e-5)


def test_base64_dimensions_and_vllms_extras(url, llm):
    text = "The quick brown fox"
    r = client(url).embeddings.create(model="tiny", input=text, dimensions=8, encoding_format="base64")
    vector = np.frombuffer(base64.b64decode(r.data[0].embedding), dtype="<f4")
    np.testing.assert_allclose(vector, _offline(llm, [text], dimensions=8)[0], rtol=1e-6, atol=1e-7)
    raw = client(url).embeddings.create(
        model="tiny", input=text, extra_body={"normalize": False, "truncate_prompt_tokens": 2}
    )
    np.testing.assert_allclose(
        raw.data[0].embedding,
        _offline(llm, [text], normalize=False, truncate_prompt_tokens=2)[0],
        rtol=1e-6,
        atol=1e-7,
    )


@pytest.mark.parametrize(
    ("kwargs", "param", "words"),
    [
        (dict(input=[]), "input", "at least one"),
        (dict(input="hi", dimensions=100_000), "dimensions", "more than the model's"),
        (dict(input=[[1, 2], [10**7]]), "input", "out of range"),
        (dict(input="hi", encoding_format="int8"), "encoding_format", ""),
    ],
)
def test_bad_embedding_requests_are_400s_naming_the_field(url, kwargs, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client(url).embeddings.create(model="tiny", **kwargs)
    assert caught.value.body["param"] == param and words in caught.value.body["message"]


def test_vllms_chat_form_embeds_the_rendered_conversation(url, llm):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "The quick brown fox"},
    ]
    r = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny", "messages": messages}, timeout=60)
    assert r.status_code == 200, r.text
    rendered = llm.render_chat(messages, add_generation_prompt=False)  # vLLM's default for embeddings
    (want,) = _offline(llm, [{"prompt_token_ids": rendered["prompt_token_ids"]}])
    body = r.json()
    np.testing.assert_allclose(body["data"][0]["embedding"], want, rtol=1e-6, atol=1e-7)
    assert body["usage"]["prompt_tokens"] == len(rendered["prompt_token_ids"])
    for extra, param in (({"input": "hi"}, "messages"), ({"messages": None}, "input")):
        bad = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny", "messages": messages, **extra})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text


def test_an_unknown_model_is_404(url):
    with pytest.raises(openai.NotFoundError, match="'other' does not exist"):
        client(url).embeddings.create(model="other", input="hi")


def test_request_ids_and_prompt_token_counts_as_completions_have_them(url, llm):
    before = metric(url, "fastpath_prompt_tokens_total")
    r = httpx.post(
        f"{url}/v1/embeddings", json={"input": [[1, 2, 3], [4, 5]]}, headers={"X-Request-Id": "gw-7"}
    )
    assert r.json()["id"] == "embd-gw-7" and r.headers["x-request-id"] == "gw-7"
    a, b = (httpx.post(f"{url}/v1/embeddings", json={"input": "hi"}).json()["id"] for _ in range(2))
    assert a != b
    assert metric(url, "fastpath_prompt_tokens_total") >= before + 5
