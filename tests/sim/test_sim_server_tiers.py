"""The simulated engine's host KV tier and TTL pins over HTTP: flags, request fields, metrics."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.embedded import EmbeddedEngine
from thunder_mw.sim.server import add_sim_engine_arguments, settings_from_args

# 8 usable blocks of 16 tokens: two ~100-token prompts evict each other.
TIER = dict(
    num_blocks=9,
    block_size=16,
    profile="instant",
    host_kv_tokens=1024,
    host_kv_load_tokens_per_s=1e6,
)


def _with_engine(body: Callable[[httpx.AsyncClient], Awaitable[Any]], **settings: Any) -> Any:
    async def main() -> Any:
        engine = EmbeddedEngine(SimEngineSettings(**settings))
        url = await engine.start()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                return await body(client)
        finally:
            await engine.stop()

    return asyncio.run(main())


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k == "source"))
            out[(s.name, labels)] = s.value
    return out


async def _overflow_and_return(client: httpx.AsyncClient) -> dict[str, Any]:
    a = list(range(1000, 1100))
    b = list(range(2000, 2100))
    for prompt in (a, b):
        r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
        assert r.status_code == 200
    again = await client.post("/v1/completions", json={"prompt": [*a, 5], "max_tokens": 1})
    answer: dict[str, Any] = again.json()
    return answer


def test_vllm_flavour_reports_host_tier_hits_under_the_connector_metric_names() -> None:
    async def body(client: httpx.AsyncClient) -> tuple[dict[str, Any], str]:
        answer = await _overflow_and_return(client)
        return answer, (await client.get("/metrics")).text

    answer, text = _with_engine(body, **TIER)
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    samples = _samples(text)
    host = samples[("vllm:prompt_tokens_cached_by_source_total", (("source", "host"),))]
    device = samples[("vllm:prompt_tokens_cached_by_source_total", (("source", "device"),))]
    assert host > 0
    assert samples[("vllm:external_prefix_cache_hits_total", ())] == host
    # The returning request's cached tokens include what the host tier gave back.
    assert cached == 96 and host + device >= cached
    assert samples[("vllm:kv_offload_load_time_total", ())] > 0


def test_without_a_host_tier_the_offload_series_are_absent() -> None:
    async def body(client: httpx.AsyncClient) -> str:
        await _overflow_and_return(client)
        return (await client.get("/metrics")).text

    text = _with_engine(body, **{**TIER, "host_kv_tokens": 0})
    assert "vllm:prompt_tokens_cached_by_source" not in text
    assert "vllm:kv_offload_load_time" not in text
    assert "vllm:external_prefix_cache_hits_total" in text  # vLLM always has these


def test_sglang_flavour_reports_the_hicache_series() -> None:
    async def body(client: httpx.AsyncClient) -> str:
        await _overflow_and_return(client)
        return (await client.get("/metrics")).text

    samples = _samples(_with_engine(body, flavor="sglang", **TIER))
    assert samples[("sglang:hicache_host_total_tokens", ())] == 1024
    assert samples[("sglang:hicache_host_used_tokens", ())] > 0
    assert samples[("sglang:hicache_backup_tokens_total", ())] > 0
    assert samples[("sglang:load_back_tokens_total", ())] > 0


def test_the_routers_kv_retention_ttl_pins_the_programs_blocks() -> None:
    ctx = {"agentic_context": {"program_id": "p1", "kv_retention_ttl_seconds": 30}}

    async def body(client: httpx.AsyncClient) -> dict[str, Any]:
        r = await client.post(
            "/v1/completions",
            json={"prompt": list(range(1000, 1100)), "max_tokens": 1, "vllm_xargs": ctx},
        )
        assert r.status_code == 200
        state = (await client.get("/debug/state")).json()
        r = await client.post(
            "/v1/completions",
            json={"prompt": [*range(1000, 1100), 7], "max_tokens": 1, "vllm_xargs": ctx},
        )
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        return {"before": state, "after": (await client.get("/debug/state")).json()}

    states = _with_engine(body, **{**TIER, "host_kv_tokens": 0})
    assert states["before"]["stats"]["pins_created"] == 1
    assert states["before"]["snapshot"]["pinned_tokens"] == 96
    assert states["after"]["stats"]["pins_released"] == 1


def test_sim_engine_flags_set_the_tier_settings() -> None:
    parser = argparse.ArgumentParser()
    add_sim_engine_arguments(parser)
    args = parser.parse_args(
        [
            "--host-kv-tokens",
            "65536",
            "--host-kv-load-tokens-per-s",
            "250000",
            "--disk-kv-tokens",
            "1048576",
            "--disk-kv-load-tokens-per-s",
            "20000",
            "--profile",
            "h100x8-glm46-fp8",
        ]
    )
    s = settings_from_args(args)
    assert (s.host_kv_tokens, s.host_kv_load_tokens_per_s) == (65536, 250000.0)
    assert (s.disk_kv_tokens, s.disk_kv_load_tokens_per_s) == (1048576, 20000.0)
