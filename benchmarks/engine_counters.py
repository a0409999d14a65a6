"""Engines' own prefix-cache, preemption and token counters, read from their /metrics.

Benchmarks report these deltas (after minus before a run) rather than anything the client or
the gateway computes, so a figure is what the engine itself counted. vLLM and SGLang name
them differently; an engine exposes one set, the other reads as zero.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["COUNTERS", "counters_of", "delta", "hit_rate", "parse_metrics", "read_counters"]

# counter -> sample names that carry it (vLLM v1, SGLang)
COUNTERS: dict[str, tuple[str, ...]] = {
    "queries": ("vllm:prefix_cache_queries_total", "sglang:prompt_tokens_total"),
    "hits": ("vllm:prefix_cache_hits_total", "sglang:cached_tokens_total"),
    "preemptions": ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total"),
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus exposition text to {sample name: value summed over label sets}."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def counters_of(samples: dict[str, float]) -> dict[str, float]:
    return {key: sum(samples.get(name, 0.0) for name in names) for key, names in COUNTERS.items()}


def read_counters(urls: Iterable[str], timeout_s: float = 30.0) -> dict[str, float]:
    """The counters summed over the engines at `urls` (base URLs; /metrics is appended)."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for url in urls:
        response = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
        response.raise_for_status()
        for key, value in counters_of(parse_metrics(response.text)).items():
            totals[key] += value
    return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in before}


def hit_rate(counted: dict[str, float]) -> float | None:
    """Prefix hit rate of a delta: cached prompt tokens / prompt tokens looked up."""
    return round(counted["hits"] / counted["queries"], 4) if counted["queries"] else None
