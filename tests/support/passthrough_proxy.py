"""A plain pass-through proxy: forwards every request to one engine and reads nothing.

The conformance suite's vacuity test target: whatever it forwards, the engine sees as sent; it
has no program views, validates nothing and strips nothing. Any check asserting an effect of
agent-context handling (`strip.*`, `reject.*`, `lifecycle.*`, `precedence.*`) must fail here
or be n/a with its reason; one that passes would pass on nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


def passthrough_proxy(engine_url: str, *, empty_program_views: bool = False) -> Starlette:
    """`empty_program_views`: also answer `GET /programs` with an empty list, as a server that
    publishes program views but never reads the conventions under test would."""
    client = httpx.AsyncClient(base_url=engine_url, timeout=60, trust_env=False)

    async def forward(request: Request) -> StreamingResponse:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        upstream = client.build_request(
            request.method,
            request.url.path,
            params=request.url.query,
            headers=headers,
            content=await request.body(),
        )
        response = await client.send(upstream, stream=True)
        kept = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_BY_HOP}
        return StreamingResponse(
            response.aiter_raw(),
            status_code=response.status_code,
            headers=kept,
            background=BackgroundTask(response.aclose),
        )

    async def no_programs(request: Request) -> JSONResponse:
        return JSONResponse({"programs": []})

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    routes = [Route("/programs", no_programs, methods=["GET"])] if empty_program_views else []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(
        routes=[*routes, Route("/{path:path}", forward, methods=methods)], lifespan=lifespan
    )
