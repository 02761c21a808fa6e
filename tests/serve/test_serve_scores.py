"""vLLM's /score and /rerank (and /v1/score, /v1/rerank, /v2/rerank): each score is LLM.score's, the
cosine of two embeddings (held to HF transformers in tests/runtime/test_pooling.py); rerank orders the
documents by it; bad bodies are 400s naming the field."""

import json
import time

import httpx
import pytest
from serve_helpers import metric, running

QUERY = "What is the capital of France?"
LONG = "word " * 5000  # past the engine's context
DOCS = [
    "The capital of Brazil is Brasilia.",
    "Paris is the capital of France.",
    "Cats sleep a lot.",
    "France",
]


@pytest.fixture(scope="module")
def url(llm):
    with running(llm) as url:
        yield url


@pytest.fixture(scope="module")
def offline(llm):
    return [o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)]


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_gives_the_offline_engines_scores(url, llm, offline, path):
    r = httpx.post(f"{url}{path}", json={"model": "tiny", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "tiny" and body["id"].startswith("score-")
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert {d["object"] for d in body["data"]} == {"score"}
    assert [d["score"] for d in body["data"]] == pytest.approx(offline, abs=1e-6)
    query_tokens = len(llm.tokenizer.encode(QUERY))
    doc_tokens = sum(len(llm.tokenizer.encode(d)) for d in DOCS)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 4 * query_tokens + doc_tokens
    assert body["usage"]["completion_tokens"] == 0
    # Newer vLLM's names for the two fields.
    for names in (("queries", "documents"), ("data_1", "data_2"), ("queries", "items")):
        again = httpx.post(f"{url}{path}", json=dict(zip(names, (QUERY, DOCS), strict=True))).json()["data"]
        assert [d["score"] for d in again] == pytest.approx(offline, abs=1e-6)
    # Two lists of one length: pair by pair.
    pairs = httpx.post(f"{url}{path}", json={"text_1": DOCS[:2], "text_2": DOCS[2:]}).json()["data"]
    want = [o.outputs.score for o in llm.score(DOCS[:2], DOCS[2:], use_tqdm=False)]
    assert [d["score"] for d in pairs] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_the_documents_by_their_score(url, offline, path):
    body = httpx.post(f"{url}{path}", json={"model": "tiny", "query": QUERY, "documents": DOCS}).json()
    want = sorted(range(len(DOCS)), key=lambda i: -offline[i])
    assert [r["index"] for r in body["results"]] == want
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
        [offline[i] for i in want], abs=1e-6
    )
    assert [r["document"]["text"] for r in body["results"]] == [DOCS[i] for i in want]
    assert body["id"].startswith("rerank-") and body["usage"]["total_tokens"] > 0
    top = httpx.post(
        f"{url}{path}", json={"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": False}
    ).json()["results"]
    assert [r["index"] for r in top] == want[:2] and all("document" not in r for r in top)
    # vLLM's top_n: every document unless it is positive.
    every = httpx.post(f"{url}{path}", json={"query": QUERY, "documents": DOCS, "top_n": -1}).json()[
        "results"
    ]
    assert [r["index"] for r in every] == want


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/score", {"text_1": DOCS[:2], "text_2": DOCS[:3]}, "text_1", "as many as text_2 (3); got 2"),
        ("/score", {"text_1": [], "text_2": DOCS}, "text_1", "at least one"),
        ("/score", {"text_1": QUERY}, "text_2", "required"),
        ("/rerank", {"query": QUERY, "documents": []}, "documents", "at least one"),
        ("/v1/rerank", {"documents": DOCS}, "query", "required"),
        # The engine's refusals name the field and the item at fault.
        ("/rerank", {"query": QUERY, "documents": [*DOCS[:2], LONG, DOCS[3]]}, "documents", "documents[2]: "),
        ("/rerank", {"query": LONG, "documents": DOCS}, "query", "query: "),
        ("/rerank", {"query": "", "documents": DOCS}, "query", "query: "),
        ("/score", {"text_1": QUERY, "text_2": [DOCS[0], LONG]}, "text_2", "text_2[1]: "),
        ("/score", {"text_1": DOCS[:2], "text_2": [LONG, DOCS[0]]}, "text_2", "text_2[0]: "),
        ("/score", {"text_1": [DOCS[0], LONG], "text_2": DOCS[:2]}, "text_1", "text_1[1]: "),
        ("/v1/embeddings", {"input": ["a", LONG]}, "input", "input[1]: "),
        ("/score", {"text_1": "\ud800", "text_2": DOCS}, "text_1", ""),  # text the tokenizer cannot take
        (
            "/rerank",
            {"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 0},
            "truncate_prompt_tokens",
            "",
        ),
        (
            "/score",
            {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 10**5},
            "truncate_prompt_tokens",
            "greater than max_model_len",
        ),
        (
            "/v1/embeddings",
            {"input": "a", "truncate_prompt_tokens": 10**5},
            "truncate_prompt_tokens",
            "greater than max_model_len",
        ),
    ],
)
def test_bad_score_and_rerank_bodies_are_400s_naming_the_field(url, path, body, param, words):
    # json.dumps escapes a lone surrogate, which httpx's own encoding refuses to send.
    r = httpx.post(f"{url}{path}", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_an_unknown_model_is_404_and_the_engine_keeps_serving(url, offline):
    r = httpx.post(f"{url}/score", json={"model": "other", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 404 and "'other' does not exist" in r.json()["error"]["message"]
    again = httpx.post(f"{url}/score", json={"text_1": QUERY, "text_2": DOCS}).json()["data"]
    assert [d["score"] for d in again] == pytest.approx(offline, abs=1e-6)


def test_a_client_that_leaves_stops_the_work_and_frees_its_place(url, llm, offline):
    docs = [f"document number {i} about nothing in particular" for i in range(6000)]
    tokens = len(llm.tokenizer.encode(QUERY)) * len(docs) + sum(len(llm.tokenizer.encode(d)) for d in docs)
    before = metric(url, "fastpath_prompt_tokens_total")
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/rerank", json={"query": QUERY, "documents": docs}, timeout=0.2)
    time.sleep(3)
    assert metric(url, "fastpath_prompt_tokens_total") - before < tokens / 2
    again = httpx.post(f"{url}/score", json={"text_1": QUERY, "text_2": DOCS}, timeout=30).json()["data"]
    assert [d["score"] for d in again] == pytest.approx(offline, abs=1e-6)
