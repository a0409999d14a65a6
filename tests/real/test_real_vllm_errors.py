"""The error answers clients parse, against the REAL vLLM CPU engine: an unknown `/v1` route is
vLLM's own 404 relayed (and the simulator answers it the same way), a wrong method on the
gateway's own routes is its 405 in the same error object, and a program whose calls vLLM
refuses holds nothing and expires after `gc_hooks.failed_ttl_s`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from support.asgi_servers import serving
from support.polling import wait_until
from support.real_vllm import RealVllm

from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import SimEngineSettings, ThunderConfig
from thunder_mw.sim.server import create_sim_app

FAILED_TTL_S = 0.5


@pytest.fixture(scope="module")
def gateway(vllm_engine: RealVllm) -> Iterator[str]:
    config = ThunderConfig(
        backends=[{"name": "vllm-0", "url": vllm_engine.url}],
        policies=[
            {"admission": {"overflow": "hold"}},
            {"state_aware_pause": {}},
            {"migration": {}},
            {"gc_hooks": {"failed_ttl_s": FAILED_TTL_S}},
        ],
        server={"tick_interval_s": 0.05},
    )
    with serving(create_app(config)) as gw:
        yield gw.url


@pytest.fixture
def client(gateway: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_an_unknown_v1_route_is_vllms_own_404_relayed_and_the_simulator_answers_alike(
    gateway: str, vllm_engine: RealVllm, client: openai.OpenAI
) -> None:
    direct = httpx.get(f"{vllm_engine.url}/v1/no-such-route", timeout=10)
    through = httpx.get(f"{gateway}/v1/no-such-route", timeout=10)
    assert through.status_code == direct.status_code == 404
    assert through.headers["content-type"] == direct.headers["content-type"]
    assert through.json() == direct.json()
    with pytest.raises(openai.NotFoundError) as info:
        client.get("/no-such-route", cast_to=object)
    assert info.value.body == direct.json()
    # The demo's engine, the simulator, answers unknown routes and methods as vLLM does.
    with serving(create_sim_app(SimEngineSettings())) as sim:
        for method, path in (("GET", "/v1/no-such-route"), ("GET", "/v1/chat/completions")):
            real = httpx.request(method, f"{vllm_engine.url}{path}", timeout=10)
            simulated = httpx.request(method, f"{sim.url}{path}", timeout=10)
            assert simulated.status_code == real.status_code, path
            assert simulated.json() == real.json(), path
            assert simulated.headers.get("allow") == real.headers.get("allow"), path


def test_a_wrong_method_is_the_gateways_405_in_the_openai_error_object(
    gateway: str, vllm_engine: RealVllm, client: openai.OpenAI
) -> None:
    assert httpx.get(f"{vllm_engine.url}/v1/chat/completions", timeout=10).status_code == 405
    with pytest.raises(openai.APIStatusError) as info:
        client.get("/chat/completions", cast_to=object)
    assert info.value.status_code == 405
    assert info.value.response.headers["allow"] == "POST"
    assert isinstance(info.value.body, dict)
    assert set(info.value.body) == {"message", "type", "param", "code"}
    assert info.value.body["code"] == "method_not_allowed"


def test_a_program_whose_calls_vllm_refuses_holds_nothing_and_expires(
    gateway: str, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="no-such-model",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            extra_body={"program_id": "refused"},
        )
    assert isinstance(info.value.body, dict)
    assert "no-such-model" in info.value.body["message"]  # vLLM's own 404, relayed
    seen = httpx.get(f"{gateway}/programs/refused").json()
    assert seen["failures"] == 1 and seen["reserved_tokens"] == 0 and seen["in_flight"] == 0
    wait_until(
        lambda: httpx.get(f"{gateway}/programs/refused").status_code == 404,
        10,
        message="program refused to expire",
    )
    gone = httpx.get(f"{gateway}/programs/refused")
    assert gone.status_code == 404
