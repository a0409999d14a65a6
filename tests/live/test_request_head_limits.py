"""Request heads are bounded (server.max_header_bytes, server.max_headers): 431, in both modes.

uvicorn's httptools parser accepts any number of headers of any size, so the gateway checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from support.asgi_servers import ServerThread, serving
from support.fake_engine import FakeEngine
from support.memory_transport import MemoryTransport
from support.polling import wait_until
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from thunder_mw.cli.bounded_head import bounded_httptools
from thunder_mw.middleware.app import ThunderMiddleware, create_app
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.sim.ports import free_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def standalone(engine: FakeEngine, **server: Any) -> AbstractContextManager[ServerThread]:
    config = ThunderConfig(backends=[{"name": "e", "url": engine.url}], server=server)
    return serving(create_app(config))


def test_a_head_over_the_default_32_kib_gets_431(engine: FakeEngine) -> None:
    with standalone(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={"x-big": "a" * 40_000})
    assert r.status_code == 431
    error = r.json()["error"]
    assert error["code"] == "headers_too_large" and error["param"] == "headers"
    assert "server.max_header_bytes" in error["message"]
    assert engine.received == []


def test_a_head_under_the_limit_is_forwarded(engine: FakeEngine) -> None:
    with standalone(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={"x-big": "a" * 20_000})
    assert r.status_code == 200
    assert engine.last().headers["x-big"] == "a" * 20_000


def test_the_limit_is_configurable(engine: FakeEngine) -> None:
    with standalone(engine, max_header_bytes=4096) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={"x-big": "a" * 5000})
    assert r.status_code == 431


def test_a_long_query_string_counts_toward_the_limit(engine: FakeEngine) -> None:
    with standalone(engine, max_header_bytes=4096) as gw:
        r = httpx.get(f"{gw.url}/v1/models?q={'a' * 5000}")
    assert r.status_code == 431


def test_too_many_headers_get_431(engine: FakeEngine) -> None:
    headers = {f"x-h{i}": "v" for i in range(101)}
    with standalone(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 431
    assert r.json()["error"]["code"] == "too_many_headers"
    assert engine.received == []


def test_admin_routes_are_bounded_too(engine: FakeEngine) -> None:
    with standalone(engine) as gw:
        r = httpx.get(f"{gw.url}/health", headers={"x-big": "a" * 40_000})
    assert r.status_code == 431


@pytest.fixture
def mounted(engine: FakeEngine) -> Iterator[tuple[ServerThread, list[str]]]:
    calls: list[str] = []

    async def anything(request: Request) -> PlainTextResponse:
        calls.append(request.url.path)
        return PlainTextResponse("ok")

    inner = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])
    config = ThunderConfig(backends=[{"name": "e", "url": engine.url}])
    with serving(ThunderMiddleware(inner, config)) as server:
        yield server, calls


def test_gateway_mode_answers_431_before_the_wrapped_app(
    mounted: tuple[ServerThread, list[str]],
) -> None:
    server, calls = mounted
    r = httpx.get(f"{server.url}/anything", headers={"x-big": "a" * 40_000})
    assert r.status_code == 431 and r.json()["error"]["code"] == "headers_too_large"
    assert calls == []


def test_gateway_mode_passes_an_ordinary_head(mounted: tuple[ServerThread, list[str]]) -> None:
    server, calls = mounted
    assert httpx.get(f"{server.url}/anything").status_code == 200
    assert calls == ["/anything"]


# ------------------------------------------------------------------ the protocol-level guard


async def _unused_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("a refused head must never reach the app")


def _guarded_protocol(max_head_bytes: int) -> tuple[Any, MemoryTransport]:
    """The bounded uvicorn protocol on an in-memory transport, on the running loop."""
    protocol_class = bounded_httptools(max_head_bytes)
    assert issubclass(protocol_class, HttpToolsProtocol)
    config = uvicorn.Config(_unused_app, http=protocol_class, lifespan="off")
    config.load()
    protocol = protocol_class(
        config=config,
        server_state=ServerState(),
        app_state={},
        _loop=asyncio.get_running_loop(),
    )
    transport = MemoryTransport()
    protocol.connection_made(transport)
    return protocol, transport


def test_an_unfinished_head_past_the_guard_is_answered_431_and_closed() -> None:
    async def feed() -> MemoryTransport:
        protocol, transport = _guarded_protocol(1000)
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        for _ in range(10):  # 6000 bytes: well past the 1000-byte guard
            if transport.closed:
                break
            protocol.data_received(b"a" * 600)
        return transport

    transport = asyncio.run(feed())
    head, _, body = b"".join(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431")
    assert json.loads(body)["error"]["code"] == "headers_too_large"


def test_a_request_that_is_not_http_is_a_400_in_the_error_object_not_plain_text() -> None:
    async def feed() -> MemoryTransport:
        protocol, transport = _guarded_protocol(1000)
        protocol.data_received(b"\x16\x03\x01 not an HTTP request\r\n\r\n")  # TLS to http://
        return transport

    transport = asyncio.run(feed())
    head, _, body = b"".join(transport.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_http_request" and error["type"] == "invalid_request_error"
    assert transport.closed


@contextlib.contextmanager
def guarded(app: ASGIApp, max_head_bytes: int) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            http=bounded_httptools(max_head_bytes),
            lifespan="off",
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        if not thread.is_alive():
            raise RuntimeError("server died during start-up")
        return server.started

    # uvicorn offers no start-up event to wait on from another thread.
    wait_until(started, 20, interval_s=0.01, message="the guarded server to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def _echo_length(scope: Scope, receive: Receive, send: Send) -> None:
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def _hangs_up_on_endless_head(port: int, most_bytes: int) -> bool:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        try:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
            for _ in range(most_bytes // 65536):
                sock.sendall(b"a" * 65536)
            sock.settimeout(5)
            answer = sock.recv(65536)
        except ConnectionError:  # reset or broken pipe: the server hung up mid-head
            return True
        except TimeoutError:  # the server is still reading: no guard
            return False
    return answer == b"" or answer.startswith(b"HTTP/1.1 431")


def test_the_guard_stops_reading_an_endless_head_over_tcp() -> None:
    with guarded(_echo_length, 64 * 1024) as url:
        assert _hangs_up_on_endless_head(int(url.rsplit(":", 1)[1]), 16 * 1024 * 1024)


def test_the_guard_passes_large_bodies_and_kept_alive_connections() -> None:
    with guarded(_echo_length, 4096) as url, httpx.Client() as client:
        for size in (10, 3_000_000, 200_000):
            r = client.post(url, content=b"x" * size, headers={"x-pad": "p" * 2000})
            assert r.status_code == 200 and r.text == str(size)
