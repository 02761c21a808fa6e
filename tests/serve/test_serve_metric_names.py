"""/metrics under vLLM's names too: what a vLLM dashboard or autoscaler reads, from the same counts."""

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fastpath.runtime.engine.core import EngineStats
from fastpath.runtime.serve.metrics import VLLM_NAMES, ServerMetrics, token_buckets


def _samples(metrics: ServerMetrics) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def metrics():
    stats = EngineStats(running=3, waiting=5, kv_blocks_total=200, kv_blocks_free=150, prompt_tokens=1234,
                        generation_tokens=777, preemptions=2)  # fmt: skip
    m = ServerMetrics(lambda: stats, "my-model")
    for seconds in (0.003, 0.02, 0.2):
        m.ttft.observe(seconds)
        m.itl.observe(seconds / 10)
        m.e2e.observe(seconds * 10)
        m.queue.observe(seconds / 2)
    m.finished.labels("stop").inc(4)
    m.finished.labels("length").inc()
    for prompt, generated in ((30, 7), (300, 1)):
        m.prompt_tokens.observe(prompt)
        m.generation_tokens.observe(generated)
    return m


def test_every_renamed_family_carries_its_source_values_with_the_model_name(metrics):
    samples = _samples(metrics)
    model = ("model_name", "my-model")
    checked = 0
    for (name, labels), value in samples.items():
        family = next((f for f in VLLM_NAMES if name.startswith(f)), None)
        if family is None or name.startswith("fastpath_http"):
            continue
        suffix = name[len(family) :]
        if suffix.endswith("created"):
            continue
        renamed_labels = {("finished_reason" if k == "finish_reason" else k, v) for k, v in labels}
        for vllm in VLLM_NAMES[family]:
            assert samples[(vllm + suffix, frozenset(renamed_labels | {model}))] == value, (vllm, suffix)
            checked += 1
    assert checked > 40, "gauges, counters and every histogram bucket were compared"


def test_what_a_vllm_dashboard_reads(metrics):
    samples = _samples(metrics)

    def one(name, **labels):
        return samples[(name, frozenset({"model_name": "my-model", **labels}.items()))]

    assert one("vllm:num_requests_running") == 3
    assert one("vllm:num_requests_waiting") == 5
    assert one("vllm:kv_cache_usage_perc") == pytest.approx(0.25)
    assert one("vllm:gpu_cache_usage_perc") == pytest.approx(0.25)
    assert one("vllm:prompt_tokens_total") == 1234
    assert one("vllm:generation_tokens_total") == 777
    assert one("vllm:num_preemptions_total") == 2
    assert one("vllm:time_to_first_token_seconds_count") == 3
    assert one("vllm:time_to_first_token_seconds_bucket", le="0.01") == 1
    assert one("vllm:inter_token_latency_seconds_sum") == pytest.approx(0.0223)
    assert one("vllm:request_success_total", finished_reason="stop") == 4
    assert one("vllm:request_success_total", finished_reason="length") == 1
    assert one("vllm:request_prompt_tokens_count") == 2
    assert one("vllm:request_prompt_tokens_bucket", le="50.0") == 1
    assert one("vllm:request_prompt_tokens_sum") == 330
    assert one("vllm:request_generation_tokens_bucket", le="1.0") == 1
    # The fastpath names stay as they were, without the added label.
    assert samples[("fastpath_requests_running", frozenset())] == 3


def test_token_count_buckets_go_1_2_5_up_to_the_context():
    assert token_buckets(512) == (1, 2, 5, 10, 20, 50, 100, 200, 500)
    assert token_buckets(1000)[-1] == 1000 and token_buckets(1) == (1,)
