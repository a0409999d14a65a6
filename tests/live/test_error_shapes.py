"""Every error the gateway writes is the OpenAI error object the real OpenAI client parses: its
own 404/405/500, header ids that are not UTF-8, `program_id: null` on release; and a program
none of whose calls succeeded holds nothing and expires soon (live, over loopback sockets)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.asgi_servers import serving
from support.fake_engine import FakeEngine
from support.polling import wait_until

from thunder_mw.middleware.app import ThunderMiddleware, create_app
from thunder_mw.schemas.config import ThunderConfig

FAILED_TTL_S = 0.5
SIM = {"name": "sim", "type": "sim", "sim": {"num_blocks": 512, "time_scale": 100.0}}
POLICIES: list[dict[str, Any]] = [
    {"admission": {"overflow": "hold"}},
    {"state_aware_pause": {}},
    {"migration": {}},
    {"gc_hooks": {"failed_ttl_s": FAILED_TTL_S}},
]


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    """The standalone gateway in front of a simulated vLLM engine it runs itself."""
    config = ThunderConfig(backends=[SIM], policies=POLICIES, server={"tick_interval_s": 0.05})
    with serving(create_app(config)) as gw:
        yield gw.url


@pytest.fixture
def client(gateway: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-test", max_retries=0) as c:
        yield c


def chat(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(
        model=kw.pop("model", "sim-model"),
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        **kw,
    )


def body_of(error: openai.APIStatusError) -> dict[str, Any]:
    """The error object the client parsed (every error the gateway writes is a JSON object)."""
    assert isinstance(error.body, dict)
    return error.body


# ------------------------------------------------------------------ 404 / 405 / 500
def test_a_wrong_method_on_an_inference_route_is_an_openai_405_naming_the_method(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.get("/chat/completions", cast_to=object)
    error = info.value
    assert error.status_code == 405 and error.response.headers["allow"] == "POST"
    assert body_of(error)["code"] == "method_not_allowed"
    assert body_of(error)["type"] == "invalid_request_error"
    assert "GET /v1/chat/completions" in body_of(error)["message"]


def test_post_to_the_models_route_is_a_405_allowing_get(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.post("/models", cast_to=object, body={})
    assert info.value.status_code == 405 and info.value.response.headers["allow"] == "GET"
    assert body_of(info.value)["code"] == "method_not_allowed"


def test_an_unknown_v1_route_is_the_engines_own_404_relayed(client: openai.OpenAI) -> None:
    # The path goes to the engine (other /v1 routes are engine routes); the simulator answers
    # its 404 as vLLM does (JSON, test_real_vllm_errors.py compares them), so the client
    # raises NotFoundError with the parsed body.
    with pytest.raises(openai.NotFoundError) as info:
        client.get("/no-such-route", cast_to=object)
    assert info.value.response.headers["content-type"] == "application/json"
    assert info.value.body == {"detail": "Not Found"}


async def _raises(scope: Any, receive: Any, send: Any) -> None:
    """A wrapped ASGI app with a bug: it raises before answering (a framework such as
    FastAPI would answer its own 500 first; that answer is the app's, passed on)."""
    if scope["type"] == "http":
        raise RuntimeError("the wrapped gateway has a bug")
    while scope["type"] == "lifespan":  # it starts and stops (and so the gateway) as apps do
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def test_a_request_nobody_answered_gets_an_openai_500_not_a_plain_text_page(
    engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    config = ThunderConfig(backends=[{"name": "e", "url": engine.url}])
    middleware = ThunderMiddleware(_raises, config)
    with (
        serving(middleware) as gw,
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk", max_retries=0) as c,
    ):
        with pytest.raises(openai.InternalServerError) as info:
            chat(c, extra_body={"program_id": "p500"})
        assert body_of(info.value)["code"] == "internal_error"
        assert body_of(info.value)["type"] == "server_error"
        program = httpx.get(f"{gw.url}/programs/p500").json()
    # The call ended as failed: the program is not left REASONING with a call counted.
    assert program["in_flight"] == 0 and program["failures"] == 1
    assert "the wrapped gateway has a bug" in caplog.text  # the operator still sees why


# ------------------------------------------------------------------ header ids
def test_a_utf8_header_id_names_the_program_as_sent(client: openai.OpenAI, gateway: str) -> None:
    chat(client, extra_headers={"X-Dynamo-Session-ID": "café-程序".encode()})
    listed = {p["program_id"] for p in httpx.get(f"{gateway}/programs").json()["programs"]}
    assert "café-程序" in listed and "cafÃ©-ç¨åº" not in listed


def test_a_header_id_that_is_not_utf8_is_a_400_naming_the_header(
    client: openai.OpenAI, gateway: str
) -> None:
    before = httpx.get(f"{gateway}/programs").json()["count"]
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, extra_headers={"X-Dynamo-Session-ID": b"\xff\xfe"})
    assert body_of(info.value)["param"] == "x-dynamo-session-id"
    assert "UTF-8" in body_of(info.value)["message"]
    assert httpx.get(f"{gateway}/programs").json()["count"] == before  # no `ÿþ` program


# ------------------------------------------------------------------ program_id: null
def test_a_null_program_id_on_a_chat_call_is_no_program_id(
    client: openai.OpenAI, gateway: str
) -> None:
    answer = chat(client, extra_body={"program_id": None})
    assert answer.choices[0].message.content
    ids = [p["program_id"] for p in httpx.get(f"{gateway}/programs").json()["programs"]]
    assert None not in ids and "None" not in ids and "null" not in ids


@pytest.mark.parametrize("body", [{"program_id": None}, {}])
def test_release_without_a_program_id_null_or_missing_is_the_same_400(
    gateway: str, body: dict[str, Any]
) -> None:
    answer = httpx.post(f"{gateway}/programs/release", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "program_id" and "program_id is required" in error["message"]


# ------------------------------------------------------------------ failed programs
def test_a_program_whose_only_call_failed_holds_nothing_and_expires_soon(
    client: openai.OpenAI, gateway: str
) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        chat(client, model="no-such-model", extra_body={"program_id": "doomed"})
    assert body_of(info.value)["param"] == "model"  # the engine's own 404, relayed
    seen = httpx.get(f"{gateway}/programs/doomed").json()
    assert seen["failures"] == 1 and seen["steps"] == 0
    assert seen["reserved_tokens"] == 0 and seen["in_flight"] == 0
    # gc_hooks.failed_ttl_s after the failure (not idle_ttl_s, 30 minutes) it is gone.
    wait_until(
        lambda: httpx.get(f"{gateway}/programs/doomed").status_code == 404,
        10,
        message="program doomed to expire",
    )
    answer = httpx.get(f"{gateway}/programs/doomed")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "program_not_found"


def test_a_program_with_a_successful_call_outlives_the_failed_ttl(
    client: openai.OpenAI, gateway: str
) -> None:
    chat(client, extra_body={"program_id": "proven"})
    with pytest.raises(openai.NotFoundError):
        chat(client, model="no-such-model", extra_body={"program_id": "proven"})
    time.sleep(FAILED_TTL_S * 3)
    seen = httpx.get(f"{gateway}/programs/proven")
    assert seen.status_code == 200 and seen.json()["failures"] == 1


def test_a_first_call_abandoned_mid_stream_frees_its_reservation_at_once_then_expires(
    engine: FakeEngine,
) -> None:
    engine.chunks, engine.chunk_delay_s = 50, 0.05
    policies = [*POLICIES[:-1], {"gc_hooks": {"failed_ttl_s": 1.0}}]
    config = ThunderConfig(
        backends=[{"name": "e", "url": engine.url}],
        policies=policies,
        server={"tick_interval_s": 0.05},
    )
    body = {"model": "m", "messages": [], "stream": True, "max_tokens": 500, "program_id": "left"}
    with serving(create_app(config)) as gw:
        with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body) as answer:
            chunks = answer.iter_raw()  # kept: a dropped iterator closes the stream
            next(chunks)
            during = httpx.get(f"{gw.url}/programs/left").json()
            assert during["in_flight"] == 1 and during["reserved_tokens"] > 500
        seen = wait_until(
            lambda: (
                (view := httpx.get(f"{gw.url}/programs/left").json())["in_flight"] == 0 and view
            ),
            5,
            interval_s=0,
            message="the abandoned call to end",
        )
        # The client went away: the call ended as failed and its reservation went with it.
        assert seen["in_flight"] == 0 and seen["failures"] == 1
        assert seen["reserved_tokens"] == 0
        assert httpx.get(f"{gw.url}/health").json()["programs"] == 1
        wait_until(
            lambda: httpx.get(f"{gw.url}/programs/left").status_code == 404,
            10,
            message="program left to expire",
        )
        gone = httpx.get(f"{gw.url}/programs/left")
        assert gone.status_code == 404


def test_a_failing_admin_route_is_a_500_in_the_error_object(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(ThunderConfig(backends=[{"name": "e", "url": engine.url}]))

    def broken() -> list[Any]:
        raise RuntimeError("the program table is broken")

    monkeypatch.setattr(app.core.scheduler, "programs", broken)

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
                return await http.get("/programs")
        finally:
            await app.core.shutdown()

    answer = asyncio.run(ask())
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["code"] == "internal_error"
