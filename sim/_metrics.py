"""Prometheus exposition of a simulated engine under the real engine's metric names and labels."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from thunder_mw.sim.engine import Engine

__all__ = ["CONTENT_TYPE", "SimService", "render"]


class SimService(Protocol):
    """What the exposition reads of the simulated engine's service (sim/server.py's
    `SimService` is one); declared here so that the server imports this module, not the
    other way round."""

    @property
    def flavor(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def time_scale(self) -> float: ...
    @property
    def started_at(self) -> float: ...
    @property
    def engine(self) -> Engine: ...
    def recent_generation_throughput(self) -> float: ...


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM 0.32's vllm:cache_config_info labels (its CacheConfig fields as strings), as served
# by the CPU build; the sim overrides the sizes.
_VLLM_CACHE_INFO = {
    "_block_size_resolved": "True",
    "block_size": "128",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "128",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "engine": "0",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "1.5",
    "kv_cache_memory_bytes": "1073741824",
    "kv_cache_size_tokens": "3072",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "24",
    "num_gpu_blocks_override": "24",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def _one_sample_families(
    labels: list[str], values: list[str], created: float
) -> tuple[
    Callable[[str, str, float], GaugeMetricFamily], Callable[[str, str, float], CounterMetricFamily]
]:
    """Makers of a gauge and a counter family holding one sample under the engine's labels."""

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=labels)
        g.add_metric(values, value)
        return g

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=labels, created=created)
        c.add_metric(values, value)
        return c

    return gauge, counter


class _EngineCollector:
    """A Prometheus collector of one simulated engine's series, read at scrape time."""

    def __init__(self, service: SimService) -> None:
        self._service = service


class _VllmCollector(_EngineCollector):
    def collect(self) -> Iterator[Metric]:
        svc = self._service
        eng = svc.engine
        st = eng.stats
        labels = ["model_name", "engine"]
        values = [svc.model_name, "0"]
        gauge, counter = _one_sample_families(labels, values, svc.started_at)

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            eng.num_running,
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            eng.waiting_after_schedule,
        )
        yield gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            eng.pool.usage(),
        )
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            st.prefix_cache_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            st.prefix_cache_hits,
        )
        yield counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            st.num_preemptions,
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=[*labels, "source"],
            created=svc.started_at,
        )
        local_hits = st.prompt_tokens_cached - st.prompt_tokens_loaded
        for source, value in (
            ("local_compute", st.prompt_tokens - st.prompt_tokens_cached),
            ("local_cache_hit", local_hits),
            ("external_kv_transfer", st.prompt_tokens_loaded),
        ):
            by_source.add_metric([*values, source], value)
        yield by_source
        yield counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
            st.external_prefix_cache_queries,
        )
        yield counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
            st.external_prefix_cache_hits,
        )
        if eng.host_tier is not None:
            yield from _vllm_offload(svc, labels, values)
        yield counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            st.prompt_tokens_cached,
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            st.generation_tokens,
        )
        yield from _vllm_request_phases(svc, labels, values)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*labels, "finished_reason"],
            created=svc.started_at,
        )
        for reason in ("stop", "length", "abort", "error", "repetition"):
            success.add_metric([*values, reason], st.requests_finished.get(reason, 0))
        yield success
        cfg = eng.config
        info_values = dict(_VLLM_CACHE_INFO)
        info_values.update(
            block_size=str(cfg.block_size),
            effective_attention_block_size=str(cfg.block_size),
            num_gpu_blocks=str(cfg.num_blocks),
            num_gpu_blocks_override=str(cfg.num_blocks),
            kv_cache_size_tokens=str(cfg.num_blocks * cfg.block_size),
            kv_cache_max_concurrency=str(
                round(cfg.num_blocks * cfg.block_size / cfg.max_model_len, 2)
            ),
            engine="0",
        )
        names = sorted(info_values)
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=names
        )
        info.add_metric([info_values[k] for k in names], 1.0)
        yield info


def _vllm_request_phases(svc: SimService, labels: list[str], values: list[str]) -> Iterator[Metric]:
    """vLLM's per-request prefill and decode histograms, as their sums and counts (one +Inf
    bucket): what a gateway learns an engine's prefill and decode costs from. Times are the
    engine's simulated seconds over the time scale, i.e. the wall seconds clients see."""
    st = svc.engine.stats
    scale = svc.time_scale
    for name, doc, total in (
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            st.request_prefill_seconds / scale,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            st.request_decode_seconds / scale,
        ),
        (
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            float(st.request_prefill_kv_computed_tokens),
        ),
    ):
        h = HistogramMetricFamily(name, doc, labels=labels)
        h.add_metric(values, [("+Inf", float(st.requests_timed))], total)
        yield h
    # Per engine step and per decoded token: what the prefill price's regression reads
    # (policies/overflow_cost.py `StepFit`). The steps' token sum is left at the tokens
    # the engine computed in prompts (queries less hits) and decoded.
    steps = HistogramMetricFamily(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        labels=labels,
    )
    computed = st.prefix_cache_queries - st.prefix_cache_hits
    steps.add_metric(values, [("+Inf", float(st.steps))], float(computed + st.generation_tokens))
    yield steps
    itl = HistogramMetricFamily(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        labels=labels,
    )
    itl.add_metric(values, [("+Inf", float(st.inter_tokens))], st.inter_token_seconds / scale)
    yield itl


def _vllm_offload(svc: SimService, labels: list[str], values: list[str]) -> Iterator[Metric]:
    """What vLLM 0.32 exposes with its native offloading connector (`--kv-offloading-size`):
    cached prompt tokens by tier (vllm/v1/metrics/loggers.py) and the connector's transfer
    counters (distributed/kv_transfer/kv_connector/v1/offloading/metrics.py). Store time is
    not modelled (stores overlap the steps), so vllm:kv_offload_store_time is not emitted."""
    eng = svc.engine
    st = eng.stats
    tier = eng.host_tier
    assert tier is not None
    bs = eng.config.block_size
    cached = CounterMetricFamily(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
        "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
        "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
        "vllm:external_prefix_cache_hits.",
        labels=[*labels, "source"],
        created=svc.started_at,
    )
    for source in ("device", "host", "p2p", "disk", "external_unspecified"):
        cached.add_metric([*values, source], st.cached_by_source.get(source, 0))
    yield cached
    kv_bytes = eng.kv_bytes_per_token
    if kv_bytes:
        stored_blocks = tier.stored_blocks
        for name, doc, value in (
            (
                "vllm:kv_offload_load_bytes",
                "Total bytes loaded from offload storage to GPU.",
                st.kv_load_tokens * kv_bytes,
            ),
            (
                "vllm:kv_offload_store_bytes",
                "Total bytes stored from GPU to offload storage.",
                stored_blocks * bs * kv_bytes,
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=labels, created=svc.started_at)
            c.add_metric(values, value)
            yield c
    load_time = CounterMetricFamily(
        "vllm:kv_offload_load_time",
        "Total load time from offload storage to GPU, in seconds.",
        labels=labels,
        created=svc.started_at,
    )
    load_time.add_metric(values, st.kv_load_seconds)
    yield load_time


class _SglangCollector(_EngineCollector):
    def collect(self) -> Iterator[Metric]:
        svc = self._service
        eng = svc.engine
        st = eng.stats
        snap = eng.snapshot()
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        values = [svc.model_name, "unified", "0", "0"]
        gauge, counter = _one_sample_families(labels, values, svc.started_at)

        queries = st.prefix_cache_queries
        cached_tokens = st.prefix_cache_hits + st.external_prefix_cache_hits
        yield gauge(
            "sglang:num_running_reqs", "The number of running requests.", snap["num_running"]
        )
        yield gauge(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            snap["num_waiting"],
        )
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", snap["used_tokens"])
        yield gauge("sglang:token_usage", "The token usage.", snap["kv_usage"])
        yield gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV pool.",
            snap["capacity_tokens"],
        )
        yield gauge(
            "sglang:kv_available_tokens",
            "Number of available KV tokens.",
            snap["capacity_tokens"] - snap["used_tokens"],
        )
        yield gauge(
            "sglang:kv_evictable_tokens", "Number of evictable KV tokens.", snap["evictable_tokens"]
        )
        yield gauge(
            "sglang:cache_hit_rate",
            "The prefix cache hit rate.",
            cached_tokens / queries if queries else 0.0,
        )
        yield gauge("sglang:num_paused_reqs", "The number of paused requests.", 0)
        yield gauge(
            "sglang:gen_throughput",
            "The generation throughput (token/s).",
            svc.recent_generation_throughput(),
        )
        yield counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens
        )
        yield counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            st.generation_tokens,
        )
        yield counter("sglang:cached_tokens", "Number of cached prompt tokens.", cached_tokens)
        yield counter(
            "sglang:num_requests",
            "The number of processed requests.",
            sum(st.requests_finished.values()),
        )
        yield counter(
            "sglang:num_retracted_requests", "The number of retracted requests.", st.num_preemptions
        )
        tier = eng.host_tier
        if tier is not None:
            # HiCache's series, by the names tools scraping SGLang read (SGLang's own source
            # was not at hand): host pool occupancy, GPU->host backups, host->GPU loads.
            bs = eng.config.block_size
            yield gauge(
                "sglang:hicache_host_used_tokens",
                "Tokens held in the HiCache host pool.",
                len(tier) * bs,
            )
            yield gauge(
                "sglang:hicache_host_total_tokens",
                "Capacity of the HiCache host pool in tokens.",
                tier.capacity_blocks * bs,
            )
            for name, doc, value in (
                (
                    "sglang:hicache_backup_tokens",
                    "Tokens backed up from device to host.",
                    tier.stored_blocks * bs,
                ),
                (
                    "sglang:load_back_tokens",
                    "Tokens loaded back from host to device.",
                    tier.loaded_blocks * bs,
                ),
            ):
                c = CounterMetricFamily(name, doc, labels=[*labels, "pool"], created=svc.started_at)
                c.add_metric([*values, "kv"], value)
                yield c


def render(service: SimService) -> bytes:
    """The /metrics body for the service's flavour, computed from the engine at scrape time."""
    registry = CollectorRegistry(auto_describe=False)
    collector = _VllmCollector(service) if service.flavor == "vllm" else _SglangCollector(service)
    registry.register(collector)
    return generate_latest(registry)
