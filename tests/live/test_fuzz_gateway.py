"""Differential fuzzing: a seeded slice of benchmarks/fuzz.py's cases, straight to an engine
and through a real gateway in front of it. The gateway relays the engine's 4xx or answers a
4xx of its own naming the field, never a 5xx, never a hang, and is healthy afterwards.

The committed run (10,000 cases on the simulator, 1,000 on the real vLLM engine) is
`thunder-mw bench --scenario fuzz` (results/fuzz.json); this is its first slice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from support.asgi_servers import serving
from support.real_vllm import RealVllm

from thunder_mw.benchmarks.fuzz import Answer, Tally, health_after, run_cases, verdict
from thunder_mw.benchmarks.fuzz_bodies import FAMILIES, generate, make_case
from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import SimEngineSettings, ThunderConfig
from thunder_mw.sim.server import create_sim_app

MODEL = "tiny"
SIM_SLICE = 60
REAL_SLICE = 40


@contextmanager
def _gateway(engine_url: str) -> Iterator[str]:
    config = ThunderConfig(
        backends=[{"name": "e", "url": engine_url}], tools={"docker": {"enabled": False}}
    )
    with serving(create_app(config)) as gateway:
        yield gateway.url


def _run_slice(engine_url: str, seed: int, count: int) -> tuple[dict[str, Any], dict[str, Any]]:
    tally = Tally("slice", seed, 0, count)
    with _gateway(engine_url) as gateway_url:
        cases = generate(seed, count, MODEL)
        asyncio.run(run_cases(tally, cases, engine_url, gateway_url, concurrency=4))
        health = health_after(gateway_url, MODEL)
    return tally.report(sample=count), health


def _assert_contract(report: dict[str, Any], health: dict[str, Any]) -> None:
    assert report["gateway_5xx"] == 0, report["contract_breaches_sample"]
    assert report["gateway_unanswered"] == 0, report["contract_breaches_sample"]
    assert report["contract_breaches_total"] == 0, report["contract_breaches_sample"]
    assert health == {"health_status": 200, "backends_healthy": True, "normal_request_status": 200}


def test_a_seeded_slice_keeps_the_gateways_contract_in_front_of_the_simulator() -> None:
    settings = SimEngineSettings(
        max_model_len=2048, num_blocks=4096, model_name=MODEL, time_scale=1000.0
    )
    with serving(create_sim_app(settings)) as engine:
        report, health = _run_slice(engine.url, seed=0, count=SIM_SLICE)
    _assert_contract(report, health)
    assert set(report["by_family"]) == set(FAMILIES)  # the slice exercises every family
    assert report["direct_status_classes"].get("2xx", 0) > 0  # and some bodies are served
    assert report["direct_status_classes"].get("5xx", 0) == 0  # the simulator never 500s


def test_a_seeded_slice_keeps_the_gateways_contract_in_front_of_the_real_vllm_engine(
    vllm_engine: RealVllm,
) -> None:
    report, health = _run_slice(vllm_engine.url, seed=1, count=REAL_SLICE)
    _assert_contract(report, health)


def test_the_same_seed_and_index_give_the_same_case() -> None:
    assert make_case(7, 123, MODEL) == make_case(7, 123, MODEL)
    assert generate(7, 5, MODEL, start=3)[0] == make_case(7, 3, MODEL)
    assert make_case(7, 123, MODEL) != make_case(8, 123, MODEL)


_ENGINE_400 = b'{"error":{"message":"bad","type":"BadRequestError","param":"top_p","code":400}}'


def test_an_engine_4xx_passed_on_unchanged_is_relayed() -> None:
    assert verdict(Answer(400, _ENGINE_400), Answer(400, _ENGINE_400)) == "relayed"


def test_a_gateway_4xx_naming_the_field_keeps_the_contract_where_the_engine_served() -> None:
    own = b'{"error":{"message":"m","type":"invalid_request_error","param":"program_id",'
    own += b'"code":"invalid_agent_context"}}'
    assert verdict(Answer(200, b"{}"), Answer(400, own)) == "own_4xx_naming_field"
    unnamed = own.replace(b'"program_id"', b"null")
    assert verdict(Answer(200, b"{}"), Answer(400, unnamed)) == "own_4xx_naming_no_field"


def test_a_5xx_no_answer_or_a_served_refusal_break_the_contract_stripping_aside() -> None:
    assert verdict(Answer(400, _ENGINE_400), Answer(None, error="timeout")) == "unanswered"
    assert verdict(Answer(400, _ENGINE_400), Answer(502, b"{}")) == "gateway_5xx"
    assert verdict(Answer(400, _ENGINE_400), Answer(200, b"{}")) == "served_an_engine_refusal"
    refused_context = _ENGINE_400.replace(b"top_p", b"vllm_xargs.agentic_context")
    assert verdict(Answer(400, refused_context), Answer(200, b"{}")) == "served_after_stripping"
    other = _ENGINE_400.replace(b"top_p", b"input")
    assert verdict(Answer(400, _ENGINE_400), Answer(400, other)) == "relayed_after_stripping"
    assert verdict(Answer(400, _ENGINE_400), Answer(400, b"plain")) == "engine_4xx_changed"
