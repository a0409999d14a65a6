"""ThunderMiddleware mounted on someone else's ASGI app (a FastAPI gateway that forwards)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI, Request
from support.asgi_servers import serving
from support.fake_engine import FakeEngine

from thunder_mw import call_state, report_usage
from thunder_mw.middleware.app import ThunderMiddleware
from thunder_mw.schemas.config import ThunderConfig


def make_gateway(engine_url: str) -> tuple[ThunderMiddleware, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        call = call_state(request.scope)
        assert call.context is not None and call.backend_url is not None
        seen.append(
            {
                "body": body,
                "backend": call.backend,
                "backend_url": call.backend_url,
                "program": call.context.program_id,
                "content_length": request.headers.get("content-length"),
            }
        )
        async with httpx.AsyncClient(base_url=call.backend_url) as client:
            answer: dict[str, Any] = (await client.post("/v1/chat/completions", json=body)).json()
        usage = answer["usage"]
        report_usage(request.scope, usage["prompt_tokens"], usage["completion_tokens"])
        return answer

    @app.get("/own-route")
    async def own() -> dict[str, Any]:
        return {"mine": True}

    config = ThunderConfig(backends=[{"name": "engine", "url": engine_url}])
    return ThunderMiddleware(app, config=config), seen


def test_wrapped_app_sees_the_stripped_body_and_the_chosen_backend(engine: FakeEngine) -> None:
    app, seen = make_gateway(engine.url)
    with serving(app) as gw:
        r = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": "m", "messages": [], "program_id": "p1", "docker_ids": ["c1"]},
        )
    assert r.status_code == 200
    call = seen[0]
    assert call["body"] == {"model": "m", "messages": []}
    assert call["program"] == "p1"
    assert call["backend"] == "engine" and call["backend_url"] == engine.url
    assert call["content_length"] == str(len(b'{"model":"m","messages":[]}'))
    assert "program_id" not in engine.last().body


def test_usage_reported_by_the_wrapped_app_is_accounted(engine: FakeEngine) -> None:
    app, _ = make_gateway(engine.url)
    with serving(app) as gw:
        httpx.post(
            f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": [], "program_id": "p1"}
        )
        program = httpx.get(f"{gw.url}/programs/p1").json()
    assert program["steps"] == 1 and program["completion_tokens"] == engine.chunks


def test_bad_context_is_rejected_before_the_wrapped_app_runs(engine: FakeEngine) -> None:
    app, seen = make_gateway(engine.url)
    with serving(app) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "program_id": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "program_id"
    assert seen == []


def test_the_wrapped_apps_own_routes_still_work(engine: FakeEngine) -> None:
    app, _ = make_gateway(engine.url)
    with serving(app) as gw:
        assert httpx.get(f"{gw.url}/own-route").json() == {"mine": True}
        assert httpx.get(f"{gw.url}/health").json()["backends"][0]["healthy"] is True
