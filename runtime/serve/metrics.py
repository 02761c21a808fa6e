"""Prometheus metrics: the engine's state read at scrape time, request latencies observed as they happen.

Each app has its own registry, so several servers (tests, a bench) share a process without clashing.
Every metric vLLM also exports is shown a second time under vLLM's name (`vllm:num_requests_running`,
...) with its `model_name` label, renamed at scrape time, so dashboards, alerts and autoscalers
written for vLLM read this server unchanged.
Behind several API server processes (`--api-server-count`), prometheus_client's multiprocess mode
(PROMETHEUS_MULTIPROC_DIR, set before the processes start) sums every process's request metrics, so a
scrape answered by any one of them shows the whole server; in that mode the values live in files per
process, so two apps in one process would share them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..engine.core import EngineStats

# Seconds; vLLM's buckets, from a graph-replayed step to a long queue.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.2, 0.4, 0.8, 1.6)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300)


def token_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token-count buckets 1, 2, 5, 10, 20, 50, ... up to `max_tokens` (the context), as vLLM's."""
    out, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > max_tokens:
                return tuple(out)
            out.append(step * scale)
        scale *= 10


class EngineCollector:
    """Requests running and waiting, KV-cache blocks, token and preemption counts, from `stats()`."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield _gauge("fastpath_requests_running", "Sequences in the running batch.", s.running)
        yield _gauge("fastpath_requests_waiting", "Sequences waiting for a batch slot.", s.waiting)
        yield _gauge("fastpath_kv_cache_blocks_total", "KV-cache blocks the engine owns.", s.kv_blocks_total)
        yield _gauge(
            "fastpath_kv_cache_blocks_free", "KV-cache blocks not held by any sequence.", s.kv_blocks_free
        )
        used = 1 - s.kv_blocks_free / s.kv_blocks_total if s.kv_blocks_total else 0.0
        yield _gauge("fastpath_kv_cache_usage_ratio", "Share of KV-cache blocks in use (0 to 1).", used)
        yield _counter("fastpath_prompt_tokens", "Prompt tokens admitted.", s.prompt_tokens)
        yield _counter("fastpath_generation_tokens", "Tokens generated.", s.generation_tokens)
        yield _counter("fastpath_preemptions", "Sequences preempted to free KV cache.", s.preemptions)
        yield _counter(
            "fastpath_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            s.prefix_cache_queries,
        )
        yield _counter(
            "fastpath_prefix_cache_hits", "Prompt tokens the prefix cache held.", s.prefix_cache_hits
        )
        for name, doc, values in (
            ("fastpath_engine_steps", "Engine steps completed, by phase.", s.steps),
            ("fastpath_engine_step_tokens", "Tokens the engine's steps computed, by phase.", s.step_tokens),
            (
                "fastpath_engine_step_seconds",
                "Seconds from each step's previous delivery to its own, by phase (the engine's pace).",
                s.step_seconds,
            ),
            (
                "fastpath_engine_step_wait_seconds",
                "Of the step seconds, those the engine loop waited for the device, by phase (the rest is "
                "host work).",
                s.step_wait_seconds,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["phase"])
            for phase in ("prefill", "decode"):
                family.add_metric([phase], values.get(phase, 0))
            yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# fastpath family -> vLLM's names for it (V1 engine; the older aliases vLLM dashboards still read), and
# label renames. Same types and units: vLLM's "perc" is a fraction from 0 to 1, as ours.
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "fastpath_requests_running": ("vllm:num_requests_running",),
    "fastpath_requests_waiting": ("vllm:num_requests_waiting",),
    "fastpath_kv_cache_usage_ratio": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "fastpath_prompt_tokens": ("vllm:prompt_tokens",),
    "fastpath_generation_tokens": ("vllm:generation_tokens",),
    "fastpath_preemptions": ("vllm:num_preemptions",),
    "fastpath_prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "fastpath_prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "fastpath_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "fastpath_inter_token_latency_seconds": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    "fastpath_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "fastpath_request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "fastpath_request_finished": ("vllm:request_success",),
    "fastpath_request_prompt_tokens": ("vllm:request_prompt_tokens",),
    "fastpath_request_generation_tokens": ("vllm:request_generation_tokens",),
}
VLLM_LABELS = {"finish_reason": "finished_reason"}


class VllmNamed:
    """A registry's metrics as they are, then those vLLM also exports once more under vLLM's names."""

    def __init__(self, source: Collector, model_name: str) -> None:
        self._source = source
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
        renamed = []
        for metric in self._source.collect():
            yield metric
            renamed += [_renamed(metric, name, self._model) for name in VLLM_NAMES.get(metric.name, ())]
        yield from renamed


def _renamed(metric: Metric, name: str, model: str) -> Metric:
    out = Metric(name, metric.documentation, metric.type, metric.unit)
    for sample in metric.samples:
        labels = {VLLM_LABELS.get(k, k): v for k, v in sample.labels.items()} | {"model_name": model}
        out.add_sample(
            name + sample.name[len(metric.name) :], labels, sample.value, sample.timestamp, sample.exemplar
        )
    return out


class ServerMetrics:
    def __init__(
        self, stats: Callable[[], EngineStats], model_name: str = "", max_model_len: int = 1 << 20
    ) -> None:
        r = CollectorRegistry(auto_describe=True)  # where this process's metrics are made
        source = r
        if os.environ.get(MULTIPROC_ENV):
            source = CollectorRegistry()
            multiprocess.MultiProcessCollector(source)
        source.register(EngineCollector(stats))
        self.registry = CollectorRegistry(auto_describe=False)  # what /metrics exposes
        self.registry.register(VllmNamed(source, model_name))
        self.ttft = Histogram(
            "fastpath_time_to_first_token_seconds",
            "From a request's arrival to its first token, streamed requests.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "fastpath_inter_token_latency_seconds",
            "Between a streamed request's successive tokens.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "fastpath_request_queue_time_seconds",
            "From a request's arrival to its first batch slot in the engine (vLLM's request_queue_time).",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "fastpath_e2e_request_latency_seconds",
            "From a request's arrival to its last token.",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "fastpath_http_requests",
            "HTTP requests answered, by route and status.",
            ["route", "status"],
            registry=r,
        )
        self.finished = Counter(
            "fastpath_request_finished", "Completions finished, by reason.", ["finish_reason"], registry=r
        )
        # Per finished completion, as `finished` counts them (vLLM's engine runs each of n as a request).
        self.prompt_tokens = Histogram(
            "fastpath_request_prompt_tokens",
            "Prompt tokens of each finished completion.",
            buckets=token_buckets(max_model_len),
            registry=r,
        )
        self.generation_tokens = Histogram(
            "fastpath_request_generation_tokens",
            "Tokens generated by each finished completion.",
            buckets=token_buckets(max_model_len),
            registry=r,
        )
        self.rejected = Counter(
            "fastpath_requests_rejected",
            "Requests refused before the engine, by reason.",
            ["reason"],
            registry=r,
        )
        self.aborted = Counter(
            "fastpath_requests_aborted",
            "Requests cut before they finished: the client left, or the drain ran out.",
            registry=r,
        )
