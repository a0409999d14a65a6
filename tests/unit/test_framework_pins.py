"""The framework internals the gateway still relies on, each pinned by the behaviour it gives
and the version it was checked against: aiohttp 3.14.5, uvicorn 0.54.0, Starlette 1.10.0.
A new release that moves one of them fails here, by name, before it fails anywhere else."""

from __future__ import annotations

import asyncio
import inspect
import re

import aiohttp
import httpx
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from thunder_mw.cli.bounded_head import bounded_httptools
from thunder_mw.engines.pooled_connections import KeepAliveConnector
from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

SIM = {"name": "sim", "type": "sim", "sim": {"num_blocks": 512, "time_scale": 100.0}}


# ------------------------------------------------------------------ aiohttp 3.14.5
def test_aiohttp_keeps_the_idle_timeout_in_the_attribute_the_connector_shortens() -> None:
    """engines/pooled_connections.py shortens `_keepalive_timeout` when an engine announces
    `Keep-Alive: timeout=N` (aiohttp has no public setter). aiohttp reads it at each pool
    checkout; tests/test_stale_connections.py's announced-timeout test shows the effect."""

    async def check() -> None:
        connector = KeepAliveConnector(keep_alive_s=30.0)
        try:
            assert connector._keepalive_timeout == 30.0  # the constructor's value lives there
            connector.honour_keep_alive_header("timeout=2")
            assert connector._keepalive_timeout == 1.0 and connector.keep_alive_s == 1.0
        finally:
            await connector.close()

    asyncio.run(check())
    # Read when a pooled connection is handed out: the name is in the checkout's code.
    assert "_keepalive_timeout" in inspect.getsource(aiohttp.BaseConnector._get)


# ------------------------------------------------------------------ uvicorn 0.54.0
def test_uvicorn_httptools_protocol_has_the_hooks_the_bounded_head_overrides() -> None:
    """cli/bounded_head.py subclasses uvicorn's httptools protocol (uvicorn bounds no head
    with httptools; its h11 protocol does, but h11 is the slower parser). The hooks it
    overrides must still be the ones uvicorn calls; tests/test_request_head_limits.py checks
    what they do."""
    protocol = bounded_httptools(1024)
    assert issubclass(protocol, HttpToolsProtocol)
    for hook in ("data_received", "on_headers_complete", "on_message_complete"):
        assert hook in vars(HttpToolsProtocol), hook  # defined there, so overriding hooks in
        assert hook in vars(protocol), hook
    # uvicorn answers a request httptools cannot parse through this method.
    source = inspect.getsource(HttpToolsProtocol.data_received)
    assert "send_400_response" in source
    assert {400, 431} <= set(STATUS_LINE)


def test_uvicorn_response_cycle_writes_through_the_transport_it_is_given() -> None:
    """cli/bounded_head.py swaps the `transport` of the cycle uvicorn has just made in
    `on_headers_complete` (before its task runs) for one that sends the response head with
    the first body write. The cycle must keep its connection in that attribute and call
    nothing on it but the three methods the wrapper implements;
    tests/live/test_response_writes.py checks what the wrapper does."""
    made = inspect.getsource(HttpToolsProtocol.on_headers_complete)
    assert "self.cycle = RequestResponseCycle(" in made and "transport=self.transport" in made
    assert "create_task" in inspect.getsource(HttpToolsProtocol._start_asgi_task)
    assert "self.transport = transport" in inspect.getsource(RequestResponseCycle.__init__)
    used = set(re.findall(r"self\.transport\.(\w+)", inspect.getsource(RequestResponseCycle)))
    assert used == {"write", "close", "is_closing"}, used


# ------------------------------------------------------------------ Starlette 1.10.0
def test_starlette_route_keeps_the_pattern_and_methods_the_admin_routes_rewrite() -> None:
    """middleware/_admin.py's `_Route` rewrites a Route's `path_regex` (`$` to `\\Z`, with
    DOTALL) and its `methods` (no implied HEAD): both are attributes Starlette matches with."""
    route = Route("/programs/{program_id:path}", lambda request: None, methods=["GET"])
    assert route.path_regex.pattern.endswith("$")  # the suffix the rewrite replaces
    assert route.methods == {"GET", "HEAD"}  # Starlette adds HEAD; the admin API does not
    assert "path_regex" in inspect.getsource(Route.matches)
    assert "self.methods" in inspect.getsource(Route.matches)


def _answers(requests: list[tuple[str, str]]) -> list[httpx.Response]:
    """The gateway's answers to `requests`, in process (its first request starts it)."""

    async def go() -> list[httpx.Response]:
        app = create_app(ThunderConfig(backends=[SIM]))
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                return [await client.request(method, path) for method, path in requests]
        finally:
            await app.core.shutdown()

    return asyncio.run(go())


def test_an_admin_id_is_any_text_to_the_end_of_the_path_and_head_is_no_get() -> None:
    """With Starlette's own pattern a newline in an id matched no route (`.` stops at it) and
    `$` matched before a trailing one; the rewritten pattern hands the whole id over. HEAD on
    a GET route is a 405 naming GET, as for any method the API does not describe."""
    ids = {"/programs/a%0Ab": "a\\nb", "/programs/x%0A": "x\\n", "/programs/a/b": "a/b"}
    *found, head = _answers([("GET", path) for path in ids] + [("HEAD", "/programs/x")])
    for response, program_id in zip(found, ids.values(), strict=True):
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "program_not_found"
        assert f"'{program_id}'" in error["message"]
    assert head.status_code == 405 and head.headers["allow"] == "GET"
