"""One engine, many clients: 64 concurrent streams, a client that leaves, a bounded queue."""

import asyncio
import time

import httpx
import openai
import pytest
from serve_helpers import client, metric, running, wait_until

from fastpath.runtime import SamplingParams

CLIENTS = 64
TOKENS = 8


def test_64_concurrent_streams_each_get_their_solo_tokens(llm):
    prompts = [f"client {i}: the quick brown fox" for i in range(CLIENTS)]
    solo = [
        llm.generate(
            [p], SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True), use_tqdm=False
        )[0]
        .outputs[0]
        .token_ids
        for p in prompts
    ]

    async def one(api, prompt):
        stream = await api.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=TOKENS,
            temperature=0,
            stream=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        tokens, finish = [], None
        async for chunk in stream:
            tokens += chunk.choices[0].token_ids
            finish = chunk.choices[0].finish_reason or finish
        return tokens, finish

    async def all_clients(url):
        api = client(url, cls=openai.AsyncOpenAI)
        async with api:
            return await asyncio.wait_for(asyncio.gather(*(one(api, p) for p in prompts)), timeout=120)

    with running(llm) as url:
        results = asyncio.run(all_clients(url))
        assert metric(url, "fastpath_generation_tokens_total") >= CLIENTS * TOKENS
    assert [tokens for tokens, _ in results] == solo
    assert all(finish == "length" for _, finish in results)


def _open_stream(http: httpx.Client, max_tokens: int):
    """A streaming request left open after its first event: the client reads no further."""
    body = {
        "model": "tiny",
        "prompt": "The quick brown fox",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    response = http.send(http.build_request("POST", "/v1/completions", json=body), stream=True)
    assert response.status_code == 200
    lines = response.iter_lines()  # kept: a collected line iterator closes the response
    assert next(line for line in lines if line).startswith("data: ")
    return response, lines


def test_a_client_that_disconnects_frees_its_kv_blocks(llm):
    with running(llm) as url:
        total = metric(url, "fastpath_kv_cache_blocks_total")
        wait_until(lambda: metric(url, "fastpath_kv_cache_blocks_free") == total, 30, "an idle cache")
        before = metric(url, "fastpath_generation_tokens_total")
        with httpx.Client(base_url=url, timeout=30) as http:
            response, _lines = _open_stream(http, max_tokens=400)
            assert metric(url, "fastpath_kv_cache_blocks_free") < total
            response.close()
        wait_until(
            lambda: metric(url, "fastpath_kv_cache_blocks_free") == total, 30, "the blocks to be freed"
        )
        assert metric(url, "fastpath_requests_running") == 0
        assert metric(url, "fastpath_requests_aborted_total") == 1
        assert metric(url, "fastpath_generation_tokens_total") - before < 400, "the request ran to its end"


def test_a_full_queue_answers_503_and_recovers(llm):
    # The bound is the batch (16) plus max_queued_requests: two open streams of 8 fill it.
    with running(llm, max_queued_requests=0) as url, httpx.Client(base_url=url, timeout=30) as http:
        body = {
            "model": "tiny",
            "prompt": "hi",
            "max_tokens": 400,
            "ignore_eos": True,
            "n": 8,
            "stream": True,
        }
        held = [
            http.send(http.build_request("POST", "/v1/completions", json=body), stream=True) for _ in range(2)
        ]
        try:
            assert [r.status_code for r in held] == [200, 200]
            refused = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert "capacity" in refused.json()["error"]["message"]
        finally:
            for r in held:
                r.close()
        deadline, refusals = time.monotonic() + 30, 1
        while (ok := http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})).status_code == 503:
            assert time.monotonic() < deadline, "the server never freed the aborted requests' places"
            refusals += 1
            time.sleep(0.05)
        assert ok.status_code == 200
        assert metric(url, 'fastpath_requests_rejected_total{reason="capacity"}') == refusals


@pytest.mark.parametrize("stream", [False, True])
def test_metrics_count_tokens_and_latencies(llm, stream):
    with running(llm) as url:
        r = client(url).completions.create(
            model="tiny", prompt="hello", max_tokens=5, stream=stream, extra_body={"ignore_eos": True}
        )
        if stream:
            assert list(r)
        text = httpx.get(f"{url}/metrics").text
        for name in (
            "fastpath_requests_running",
            "fastpath_requests_waiting",
            "fastpath_kv_cache_usage_ratio",
            "fastpath_prompt_tokens_total",
            "fastpath_generation_tokens_total",
            "fastpath_time_to_first_token_seconds_bucket",
            "fastpath_inter_token_latency_seconds_bucket",
            "fastpath_e2e_request_latency_seconds_count",
        ):
            assert name in text, name
        # Both are recorded once the response is out, so the client may be a moment ahead.
        wait_until(lambda: metric(url, "fastpath_e2e_request_latency_seconds_count") == 1, 10, "e2e")
        route = 'fastpath_http_requests_total{route="/v1/completions",status="200"}'
        wait_until(lambda: metric(url, route) == 1, 10, "the request count")
        ttft = "fastpath_time_to_first_token_seconds_count"
        assert metric(url, ttft) == 1, "TTFT is measured on every request, streamed or not"
        queue = "fastpath_request_queue_time_seconds"
        assert metric(url, f"{queue}_count") == 1, "so is the wait for a batch slot"
        assert 0 <= metric(url, f"{queue}_sum") <= metric(url, "fastpath_time_to_first_token_seconds_sum")
        gaps = metric(url, "fastpath_inter_token_latency_seconds_count")
        # Whole: the four gaps between five tokens. Streamed: a chunk may carry several tokens.
        assert gaps == 4 if not stream else 1 <= gaps <= 4, gaps
