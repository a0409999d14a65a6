"""The gateway's uvicorn protocol (cli/bounded_head.py) sends a response head with the first
body write, in one write on the connection; a head no body follows within the event loop's
turn still goes out alone, and before anything the protocol itself writes or a close.

Driven on an in-memory transport, so each write on the connection is seen as it was made."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from support.memory_transport import MemoryTransport
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from thunder_mw.cli.bounded_head import bounded_httptools
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send

REQUEST = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"


def _serve(app: ASGIApp) -> tuple[Any, MemoryTransport]:
    """The gateway's protocol class for `app`, connected to an in-memory transport."""
    protocol_class = bounded_httptools(64 * 1024)
    assert issubclass(protocol_class, HttpToolsProtocol)
    config = uvicorn.Config(app, http=protocol_class, lifespan="off", log_level="critical")
    config.load()
    protocol = protocol_class(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = MemoryTransport(strict=True)
    protocol.connection_made(transport)
    return protocol, transport


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_head_and_the_body_go_out_in_one_write() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"answer"})

    async def run() -> list[bytes]:
        protocol, transport = _serve(app)
        protocol.data_received(REQUEST)
        await _turns()
        return transport.written

    (written,) = asyncio.run(run())
    head, _, body = written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length" not in head.lower()
    assert body == b"6\r\nanswer\r\n0\r\n\r\n"


def test_a_stream_sends_its_head_with_the_first_events() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})

    async def run() -> list[bytes]:
        protocol, transport = _serve(app)
        protocol.data_received(REQUEST)
        await _turns()
        return transport.written

    first, last = asyncio.run(run())
    assert first.startswith(b"HTTP/1.1 200 OK") and first.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
    assert last == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"


def test_a_head_with_no_body_yet_goes_out_alone_by_the_next_turn() -> None:
    body_may_go = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await body_may_go.wait()  # an engine still thinking about its first event
        await send({"type": "http.response.body", "body": b"late"})

    async def run() -> tuple[list[bytes], list[bytes]]:
        protocol, transport = _serve(app)
        protocol.data_received(REQUEST)
        await _turns()
        before = list(transport.written)
        body_may_go.set()
        await _turns()
        return before, transport.written

    before, after = asyncio.run(run())
    assert len(before) == 1 and before[0].startswith(b"HTTP/1.1 200 OK")
    assert before[0].endswith(b"\r\n\r\n")
    assert after == [before[0], b"4\r\nlate\r\n0\r\n\r\n"]


def test_a_held_head_goes_out_before_a_close() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("the app fails after its head")  # uvicorn closes the connection

    async def run() -> MemoryTransport:
        protocol, transport = _serve(app)
        protocol.data_received(REQUEST)
        await _turns()
        return transport

    transport = asyncio.run(run())
    assert transport.closed
    assert len(transport.written) == 1 and transport.written[0].startswith(b"HTTP/1.1 200 OK")


def test_a_held_head_goes_out_before_what_the_protocol_writes_itself() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        # Garbage arrives on the connection in the same turn: the protocol answers it with a
        # 400 of its own, after the head it has already started.
        protocol.data_received(b"\x16\x03\x01 not an HTTP request\r\n\r\n")

    protocol: Any = None

    async def start() -> list[bytes]:
        nonlocal protocol
        protocol, transport = _serve(app)
        protocol.data_received(REQUEST)
        await _turns()
        return transport.written

    written = asyncio.run(start())
    assert written[0].startswith(b"HTTP/1.1 200 OK") and written[0].endswith(b"\r\n\r\n")
    assert written[1].startswith(b"HTTP/1.1 400")
