"""Requests that can never fit, and the bounds on held requests, through a live gateway: the
simulated engines of the demo, the real vLLM CPU engine, and an in-test engine for the holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.asgi_servers import ServerThread, serving
from support.fake_engine import FakeEngine
from support.held_requests import BIG, start_hog, wait_for
from support.polling import wait_until
from support.real_vllm import RealVllm

from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

HUGE_PROMPT = "word " * 300_000  # ~300k words: past any engine here whatever the tokenizer


def _sim(name: str) -> dict[str, Any]:
    # The demo's engines (config/demo.yaml): 98,304 tokens of KV, max_model_len 32,768.
    sim = {"num_blocks": 6144, "block_size": 16, "max_model_len": 32768, "time_scale": 10.0}
    return {"name": name, "type": "sim", "sim": sim}


@pytest.fixture(scope="module")
def demo_gateway() -> Iterator[ServerThread]:
    config = ThunderConfig(
        backends=[_sim("sim-0"), _sim("sim-1")], tools={"docker": {"enabled": False}}
    )
    with serving(create_app(config)) as gw:
        wait_until(
            lambda: all(b["healthy"] for b in httpx.get(f"{gw.url}/health").json()["backends"]),
            10,
            message="the simulated engines to become healthy",
        )
        yield gw


@pytest.fixture
def client(demo_gateway: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{demo_gateway.url}/v1", api_key="x", max_retries=0) as c:
        yield c


# "At once": well before a hold of a request larger than every engine could end
# (`alone_hold_s`, 10 s by default), with room for a loaded machine (a 1-s bound failed with
# the two cores shared by four processes).
AT_ONCE_S = 5.0


def _refused(
    client: openai.OpenAI, program_id: str, **body: Any
) -> tuple[openai.BadRequestError, float]:
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="sim-model", extra_body={"program_id": program_id}, timeout=15, **body
        )
    return err.value, time.monotonic() - started


@pytest.mark.parametrize(
    ("max_tokens", "code"),
    [
        (99_000, "context_length_exceeded"),
        (200_000, "context_length_exceeded"),
        (10**30, "integer_out_of_range"),  # past 64 bits: refused as it is read
    ],
)
def test_max_tokens_past_the_model_length_is_refused_at_once_and_nobody_pauses(
    demo_gateway: ServerThread, client: openai.OpenAI, max_tokens: int, code: str
) -> None:
    for i in range(3):
        client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "plan the fix " * 50}],
            max_tokens=16,
            extra_body={"program_id": f"normal-{i}"},
        )
    error, took = _refused(
        client, "outgrown", messages=[{"role": "user", "content": "go"}], max_tokens=max_tokens
    )
    assert took < AT_ONCE_S
    assert error.code == code and error.param == "max_tokens"
    if code == "context_length_exceeded":
        assert "32768 tokens (max_model_len of sim-" in error.message
    assert httpx.get(f"{demo_gateway.url}/programs/outgrown").status_code == 404
    for i in range(3):
        view = httpx.get(f"{demo_gateway.url}/programs/normal-{i}").json()
        assert view["state"] == "active", view  # nobody was paused to make room


def test_a_prompt_past_every_engine_is_refused_at_once(
    demo_gateway: ServerThread, client: openai.OpenAI
) -> None:
    error, took = _refused(client, "long", messages=[{"role": "user", "content": HUGE_PROMPT}])
    assert took < AT_ONCE_S
    assert error.code == "context_length_exceeded" and error.param == "messages"
    assert httpx.get(f"{demo_gateway.url}/programs/long").status_code == 404  # never held


# ---------------------------------------------------------------------- bounds on held requests
def _gateway(engine_url: str, **server: Any) -> ThunderConfig:
    return ThunderConfig(
        server=server,
        backends=[{"name": "e", "url": engine_url, "capacity_tokens": 1000}],
        policies=[
            {"admission": {"buffer_tokens_per_program": 0, "overflow": "hold"}},
            {"state_aware_pause": {}},
            {"migration": {}},
        ],
    )


@pytest.mark.slow  # ~3 s: holds behind a 3 s stream
def test_held_requests_are_bounded_by_bytes_with_503_and_retry_after() -> None:
    with serving(FakeEngine(chunks=30, chunk_delay_s=0.1)) as engine:
        with serving(create_app(_gateway(engine.url, max_held_bytes=1500))) as gw:
            hog = start_hog(gw.url)
            first = threading.Thread(
                target=lambda: httpx.post(
                    f"{gw.url}/v1/chat/completions", json={**BIG, "program_id": "w1"}, timeout=30
                )
            )
            first.start()
            wait_for(gw.url, "w1", waiting=1)  # its ~900 bytes are held
            r = httpx.post(f"{gw.url}/v1/chat/completions", json={**BIG, "program_id": "w2"})
            gone = httpx.get(f"{gw.url}/programs/w2").status_code
            first.join()
            hog.join()
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "held_bytes_full"
    assert "server.max_held_bytes" in r.json()["error"]["message"]
    assert gone == 404


@pytest.mark.slow  # ~3 s: holds behind a 3 s stream
def test_a_held_request_past_its_deadline_gets_503_and_leaves_the_queue() -> None:
    with serving(FakeEngine(chunks=30, chunk_delay_s=0.1)) as engine:
        with serving(create_app(_gateway(engine.url, max_hold_s=0.5))) as gw:
            hog = start_hog(gw.url)
            r = httpx.post(
                f"{gw.url}/v1/chat/completions", json={**BIG, "program_id": "late"}, timeout=30
            )
            still_streaming = hog.is_alive()
            gone = httpx.get(f"{gw.url}/programs/late").status_code
            hog.join()
    assert still_streaming  # it was answered on its deadline, not when room came
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "hold_timeout"
    assert gone == 404


@pytest.mark.slow  # ~3 s: holds behind a 3 s stream
def test_a_request_that_could_only_run_alone_is_placed_after_a_short_hold() -> None:
    """Larger than the engine's whole KV by the estimate (not provably): it would wait for an
    empty engine; after `alone_hold_s` it goes to the engine, which serves it."""
    alone = {**BIG, "messages": [{"role": "user", "content": "x " * 2200}], "program_id": "big"}
    with serving(FakeEngine(chunks=30, chunk_delay_s=0.1)) as engine:
        with serving(create_app(_gateway(engine.url, alone_hold_s=0.5))) as gw:
            hog = start_hog(gw.url)
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=alone, timeout=30)
            still_streaming = hog.is_alive()
            hog.join()
    assert r.status_code == 200, r.text
    assert still_streaming  # it did not wait for the engine to empty


# ---------------------------------------------------------------------- the real vLLM engine
@pytest.fixture(scope="module")
def real_gateway(vllm_engine: RealVllm) -> Iterator[ServerThread]:
    config = ThunderConfig(backends=[{"name": "vllm-0", "url": vllm_engine.url}])
    with serving(create_app(config)) as gw:
        wait_until(
            lambda: (
                httpx.get(f"{gw.url}/health").json()["backends"][0]["capacity_tokens"] is not None
            ),
            30,
            interval_s=0.1,
            message="the engine's capacity to be read",
        )
        yield gw


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200_000},
        {"messages": [{"role": "user", "content": "hello " * 4000}], "max_tokens": 8},
        {"messages": [{"role": "user", "content": HUGE_PROMPT}]},
    ],
    ids=["max_tokens", "prompt_past_model_length", "huge_prompt"],
)
def test_the_real_engine_and_the_gateway_refuse_the_same_bodies_at_once(
    real_gateway: ServerThread, vllm_engine: RealVllm, body: dict[str, Any]
) -> None:
    body = {"model": vllm_engine.model, **body}
    direct = httpx.post(f"{vllm_engine.url}/v1/chat/completions", json=body, timeout=60)
    started = time.monotonic()
    through = httpx.post(
        f"{real_gateway.url}/v1/chat/completions",
        json={**body, "program_id": "too-long"},
        timeout=60,
    )
    took = time.monotonic() - started
    assert direct.status_code == 400, direct.text
    assert through.status_code == 400, through.text
    assert took < AT_ONCE_S
    assert through.json()["error"]["message"]
    assert httpx.get(f"{real_gateway.url}/programs/too-long").status_code == 404
