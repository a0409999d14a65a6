"""Prometheus series of the scheduler's view of each engine, and the gateway's own latencies.

Per-backend gauges are read from the scheduler core at scrape time (nothing is kept twice);
the engine's own signals (KV usage, prefix hits, preemptions) are re-exported from the
probe's last scrape so one Prometheus job sees both sides. No series is labelled per
program: a scrape costs the same with ten programs or ten thousand.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from thunder_mw.policies.core import SchedulerCore

__all__ = ["OVERHEAD_BUCKETS", "QUEUE_WAIT_BUCKETS", "SchedulerMetrics", "hit_rate"]

QUEUE_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    if hits is None or not queries:
        return None
    return hits / queries


class _BackendGauges(Collector):
    def __init__(self, core: SchedulerCore) -> None:
        self._core = core

    def collect(self) -> Iterable[Metric]:
        core = self._core
        labels = ["backend"]
        reserved = GaugeMetricFamily(
            "thunder_mw_backend_reserved_tokens",
            "KV tokens reserved by the backend's ACTIVE programs",
            labels=labels,
        )
        effective = GaugeMetricFamily(
            "thunder_mw_backend_effective_capacity_tokens",
            "KV capacity the scheduler plans with (capacity x a scale that shrinks while the "
            "engine preempts)",
            labels=labels,
        )
        programs = GaugeMetricFamily(
            "thunder_mw_backend_programs", "ACTIVE programs placed on the backend", labels=labels
        )
        kv = GaugeMetricFamily(
            "thunder_mw_backend_engine_kv_usage_ratio",
            "KV cache usage the engine reports (0-1), from the last probe",
            labels=labels,
        )
        hits = GaugeMetricFamily(
            "thunder_mw_backend_engine_prefix_hit_ratio",
            "Engine prefix-cache hit ratio since the engine started (hits / queries, tokens)",
            labels=labels,
        )
        preemptions = CounterMetricFamily(
            "thunder_mw_backend_engine_preemptions",
            "Preemptions the engine reports (recomputed or retracted requests)",
            labels=labels,
        )
        running = GaugeMetricFamily(
            "thunder_mw_backend_engine_running_requests",
            "Requests the engine is running, from the last probe",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "thunder_mw_backend_engine_waiting_requests",
            "Requests waiting inside the engine, from the last probe",
            labels=labels,
        )
        reserved_use: list[float] = []
        engine_use: list[float] = []
        for b in core.backend_views().values():
            label = [b.label]
            reserved.add_metric(label, b.reserved)
            programs.add_metric(label, core.programs_on(b.label))
            if b.capacity is not None:
                effective.add_metric(label, int(b.capacity * b.scale))
                if b.healthy and b.capacity:
                    reserved_use.append(b.reserved / b.capacity)
            m = b.metrics
            if m.kv_usage is not None:
                kv.add_metric(label, m.kv_usage)
                if b.healthy:
                    engine_use.append(m.kv_usage)
            rate = hit_rate(m.prefix_hits_total, m.prefix_queries_total)
            if rate is not None:
                hits.add_metric(label, rate)
            if m.preemptions_total is not None:
                preemptions.add_metric(label, m.preemptions_total)
            if m.running is not None:
                running.add_metric(label, m.running)
            if m.waiting is not None:
                waiting.add_metric(label, m.waiting)
        yield from (reserved, effective, programs, kv, hits, preemptions, running, waiting)
        imbalance = GaugeMetricFamily(
            "thunder_mw_backend_imbalance_ratio",
            "Spread of KV use across healthy backends (max - min of use / capacity); "
            "source=reserved: the scheduler's reservations, source=engine: engine-reported",
            labels=["source"],
        )
        for source, uses in (("reserved", reserved_use), ("engine", engine_use)):
            if uses:
                imbalance.add_metric([source], max(uses) - min(uses))
        yield imbalance
        queue = GaugeMetricFamily(
            "thunder_mw_queue_programs", "Paused programs waiting in the global queue"
        )
        queue.add_metric([], core.queue_length())
        yield queue


class SchedulerMetrics:
    """Registers the backend gauges and owns the two latency histograms."""

    def __init__(self, registry: CollectorRegistry, core: SchedulerCore) -> None:
        registry.register(_BackendGauges(core))
        self.queue_wait = Histogram(
            "thunder_mw_queue_wait_seconds",
            "Time a request was held because its program was paused or not yet admitted",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.proxy_overhead = Histogram(
            "thunder_mw_proxy_overhead_seconds",
            "Gateway time before a request is handed to the engine client (context parsing "
            "and scheduling; time held in the queue excluded)",
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
