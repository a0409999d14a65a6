"""Specification of the simulated engine's HTTP face: OpenAI routes, admin routes, /metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.embedded import EmbeddedEngine

REFERENCE = Path(__file__).with_name("vllm_0.32_metrics.txt")


def _with_engine(body: Callable[[httpx.AsyncClient], Awaitable[Any]], **settings: Any) -> Any:
    async def main() -> Any:
        engine = EmbeddedEngine(
            SimEngineSettings(
                **{"num_blocks": 64, "block_size": 16, "profile": "instant", **settings}
            )
        )
        url = await engine.start()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                return await body(client)
        finally:
            await engine.stop()

    return asyncio.run(main())


def _families(text: str) -> dict[str, tuple[str, set[str]]]:
    out = {}
    for fam in text_string_to_metric_families(text):
        labels: set[str] = set()
        for sample in fam.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
        out[fam.name] = (fam.type, labels)
    return out


def test_vllm_metrics_have_the_real_engines_names_types_and_labels() -> None:
    async def body(client: httpx.AsyncClient) -> str:
        await client.post("/v1/completions", json={"prompt": "hello " * 40, "max_tokens": 3})
        return (await client.get("/metrics")).text

    sim = _families(_with_engine(body))
    real = _families(REFERENCE.read_text())
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_prefill_kv_computed_tokens",
    ):
        assert name in sim, name
    for name, (kind, labels) in sim.items():
        assert name in real, name
        assert (kind, labels) == real[name], name


def test_vllm_metrics_report_capacity_and_prefix_hits_in_tokens() -> None:
    async def body(client: httpx.AsyncClient) -> tuple[int, str]:
        n = (await client.post("/tokenize", json={"prompt": "word " * 40})).json()["count"]
        for _ in range(2):
            await client.post("/v1/completions", json={"prompt": "word " * 40, "max_tokens": 2})
        return n, (await client.get("/metrics")).text

    n, text = _with_engine(body)
    samples = {s.name: s for fam in text_string_to_metric_families(text) for s in fam.samples}
    info = samples["vllm:cache_config_info"].labels
    assert (info["block_size"], info["num_gpu_blocks"]) == ("16", "64")
    assert samples["vllm:prefix_cache_queries_total"].value == 2 * n
    # The repeat reuses its full blocks except the one holding its last token.
    assert samples["vllm:prefix_cache_hits_total"].value == (n - 1) // 16 * 16


def test_vllm_request_phase_histograms_feed_the_gateways_cost_counters() -> None:
    """What the cost-aware overflow rule learns from a live engine (engines/pool.py reads the
    histograms' sums): the prompt tokens computed, prefill and decode time, in wall seconds."""
    from thunder_mw.engines.pool import parse_signals

    async def body(client: httpx.AsyncClient) -> tuple[int, bytes]:
        n = (await client.post("/tokenize", json={"prompt": "word " * 40})).json()["count"]
        for _ in range(2):
            await client.post("/v1/completions", json={"prompt": "word " * 40, "max_tokens": 5})
        return n, (await client.get("/metrics")).content

    n, text = _with_engine(body, profile="h100-8b", time_scale=1000.0)
    m = parse_signals("vllm", text)
    # The repeat computes only what its cached full blocks do not hold.
    assert m.prefill_tokens_total == n + (n - (n - 1) // 16 * 16)
    assert m.decode_tokens_total == 10
    assert m.prefill_seconds_total is not None and m.decode_seconds_total is not None
    # Priced by the profile (milliseconds a step), reported over the time scale.
    assert 0 < m.prefill_seconds_total < 0.001
    assert 0 < m.decode_seconds_total < 0.001
    assert m.decode_seconds_total > m.prefill_seconds_total  # four steps against one
    # The steps and the decoded tokens' latencies (not the first tokens'), as vLLM counts.
    assert m.inter_tokens_total == 8
    assert m.steps_total == 10  # each call: one prefill step, four decoding
    assert m.inter_token_seconds_total == pytest.approx(m.decode_seconds_total)


def test_sglang_flavour_serves_its_metrics_and_load_routes() -> None:
    async def body(client: httpx.AsyncClient) -> tuple[str, Any, Any]:
        await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        return (
            (await client.get("/metrics")).text,
            (await client.get("/server_info")).json(),
            (await client.get("/v1/loads")).json(),
        )

    text, info, loads = _with_engine(body, flavor="sglang")
    names = {fam.name for fam in text_string_to_metric_families(text)}
    assert {
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:max_total_num_tokens",
    } <= names
    assert info["max_total_num_tokens"] == 63 * 16
    assert loads["loads"][0]["max_total_num_tokens"] == 63 * 16


def test_unknown_request_fields_are_accepted_and_recorded() -> None:
    async def body(client: httpx.AsyncClient) -> tuple[int, Any]:
        r = await client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1,
                "program_id": "p1",
                "extra_thing": 1,
            },
        )
        return r.status_code, (await client.get("/debug/unknown_fields")).json()

    status, seen = _with_engine(body)
    assert status == 200
    assert seen["count"] == 1 and set(seen["last"]) == {"program_id", "extra_thing"}


def test_usage_reports_cached_tokens_of_a_repeated_prompt() -> None:
    async def body(client: httpx.AsyncClient) -> list[Any]:
        out = []
        for _ in range(2):
            r = await client.post("/v1/completions", json={"prompt": "abc " * 50, "max_tokens": 4})
            out.append(r.json()["usage"])
        return out

    first, second = _with_engine(body)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == 48  # 50 tokens: 3 full blocks
    assert second["completion_tokens"] == 4


def test_streaming_sends_every_token_then_usage_then_done() -> None:
    async def body(client: httpx.AsyncClient) -> list[str]:
        lines = []
        payload = {
            "prompt": "go",
            "max_tokens": 5,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", "/v1/completions", json=payload) as r:
            async for line in r.aiter_lines():
                if line:
                    lines.append(line)
        return lines

    lines = _with_engine(body)
    assert lines[-1] == "data: [DONE]"
    assert '"completion_tokens":5' in lines[-2]
    assert sum(1 for line in lines if '"text"' in line) >= 2


def test_an_unknown_model_is_a_404() -> None:
    async def body(client: httpx.AsyncClient) -> int:
        r = await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        return r.status_code

    assert _with_engine(body) == 404


def test_tokenize_counts_like_generation_does() -> None:
    async def body(client: httpx.AsyncClient) -> tuple[int, int]:
        t = (await client.post("/tokenize", json={"prompt": "some text here"})).json()["count"]
        r = await client.post("/v1/completions", json={"prompt": "some text here", "max_tokens": 1})
        return t, r.json()["usage"]["prompt_tokens"]

    counted, used = _with_engine(body)
    assert counted == used
