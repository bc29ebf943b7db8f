"""Prometheus metrics of one server (its own registry, so several servers can run in one
process): requests by endpoint and status, tokens in and out, queue depth, running sequences,
time to first token and inter-token latency."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .._model import EngineStats

__all__ = ["Metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                    0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
                 20.0, 30.0, 60.0)


class _EngineCollector(Collector):
    """The batch engine's numbers, read when scraped."""

    def __init__(self, stats: Callable[[], Optional[EngineStats]], in_flight: Callable[[], int]) -> None:
        self._stats = stats
        self._in_flight = in_flight

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        s = self._stats()
        yield GaugeMetricFamily("reprolm_sequences_in_flight",
                                "Sequences the server has submitted and not yet finished (running or queued)",
                                value=self._in_flight())
        if s is None:
            return
        yield GaugeMetricFamily("reprolm_queue_depth", "Requests waiting for the batch engine", value=s.waiting)
        yield GaugeMetricFamily("reprolm_running_sequences", "Sequences the batch engine is computing",
                                value=s.running)
        yield GaugeMetricFamily("reprolm_kv_cache_bytes", "Bytes of KV pool blocks held by running sequences",
                                value=s.kv_bytes)
        yield GaugeMetricFamily("reprolm_kv_blocks_used", "Blocks of 16 KV positions held by running sequences",
                                value=s.kv_blocks_used)
        yield GaugeMetricFamily("reprolm_kv_blocks_free", "Blocks of 16 KV positions of kv_memory held by no running sequence",
                                value=s.kv_blocks_free)
        yield CounterMetricFamily("reprolm_preemptions", "Sequences preempted (and later recomputed) when KV memory ran out",
                                  value=s.preemptions)
        yield CounterMetricFamily("reprolm_engine_passes", "Forward passes the batch engine has run", value=s.passes)
        yield CounterMetricFamily("reprolm_engine_prompt_tokens", "Prompt tokens the batch engine has computed",
                                  value=s.prompt_tokens)
        yield CounterMetricFamily("reprolm_engine_generated_tokens", "Tokens the batch engine has generated",
                                  value=s.generated_tokens)
        yield CounterMetricFamily("reprolm_prefix_cache_hits", "Prompt blocks reused from the prefix cache",
                                  value=s.prefix_cache_hits)
        yield CounterMetricFamily("reprolm_prefix_cache_misses", "Full prompt blocks not in the prefix cache",
                                  value=s.prefix_cache_misses)
        yield CounterMetricFamily("reprolm_prefix_cache_evictions", "Blocks evicted from the prefix cache",
                                  value=s.prefix_cache_evictions)
        yield GaugeMetricFamily("reprolm_prefix_cache_bytes", "Bytes the prefix cache holds",
                                value=s.prefix_cache_bytes)


class Metrics:
    def __init__(self, stats: Callable[[], Optional[EngineStats]], in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("reprolm_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.prompt_tokens = Counter("reprolm_prompt_tokens", "Prompt tokens of completed requests",
                                     registry=self.registry)
        self.completion_tokens = Counter("reprolm_completion_tokens", "Tokens generated for completed requests",
                                         registry=self.registry)
        self.cancelled = Counter("reprolm_cancelled_sequences",
                                 "Sequences cancelled before they finished (client gone, server stopping)",
                                 registry=self.registry)
        self.ttft = Histogram("reprolm_time_to_first_token_seconds",
                              "From submission to the first generated token, per sequence",
                              buckets=_TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("reprolm_inter_token_latency_seconds", "Between successive tokens of a sequence",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(stats, in_flight))

    def render(self) -> bytes:
        return generate_latest(self.registry)
