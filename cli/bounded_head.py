"""uvicorn's httptools protocol with a memory bound on the request head, answering what it
refuses in the gateway's error object.

httptools buffers a request line and headers of any size before the app sees them (a client
can make the server hold megabytes per connection). The app's own check answers the
documented 431 once a head is parsed (middleware/app.py); this protocol drops a connection
whose head is still incomplete well past that limit, so the bytes are never held at all.

It also hands each request's response cycle its connection through `_HeadWithBody`, which
holds the response head (uvicorn writes it on `http.response.start`, alone) until the first
body write and sends both in one: one write and one TCP segment instead of two, for every
answer (a loopback write with its segment costs the gateway ~20 us of CPU, the client a
wake-up). A head no body write joins within the event loop's turn goes out alone at its end.

uvicorn's protocol classes are internal (its h11 protocol has a public head bound, but h11 is
the slower parser): the hooks overridden here, and the response cycle's `transport` with the
three calls it makes on it, were checked against uvicorn 0.54.0 and are pinned by
tests/test_framework_pins.py.
"""

from __future__ import annotations

import asyncio
from typing import cast

from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from thunder_mw.middleware.errors import error_body

__all__ = ["bounded_httptools", "raw_head_limit"]


def raw_head_limit(max_header_bytes: int, max_headers: int) -> int:
    """Raw bytes a head within both limits may take on the wire: each header adds `: ` and
    CRLF, the request line its method, version and (absolute-form) scheme and host."""
    return max_header_bytes + 4 * max_headers + 8192


def bounded_httptools(max_head_bytes: int) -> type[asyncio.Protocol]:
    """An HttpToolsProtocol class (for `uvicorn.Config(http=...)`) with this head bound."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _head_limit = max_head_bytes
        _head_bytes = 0
        _in_head = True  # from a message's end (or the connection's start) to its headers' end
        _boundary = False  # the chunk being parsed ended a head or a message

        def data_received(self, data: bytes) -> None:
            # What arrives may make the protocol write on the connection itself (a 400, an
            # upgrade): a response head still held goes out first.
            cycle = self.cycle
            if cycle is not None and isinstance(cycle.transport, _HeadWithBody):
                cycle.transport.flush()
            self._boundary = False
            super().data_received(data)
            if self._in_head and not self._boundary and not self.transport.is_closing():
                # A chunk that crossed no boundary lies wholly inside one head. (A head that
                # starts mid-chunk goes uncounted for that chunk: the bound is loose by one
                # read, never tight enough to refuse a head the app would accept.)
                self._head_bytes += len(data)
                if self._head_bytes > self._head_limit:
                    self._refuse_head()

        def on_headers_complete(self) -> None:
            self._in_head, self._boundary = False, True
            super().on_headers_complete()
            # uvicorn has just made this request's cycle (its task has not run yet); not on an
            # upgrade, which makes none.
            cycle = self.cycle
            if cycle is not None and cycle.transport is self.transport:
                # Typed as the transport it stands in for, in the three calls the cycle makes.
                holder = _HeadWithBody(cycle, self.transport, self.loop)
                cycle.transport = cast(asyncio.Transport, holder)

        def on_message_complete(self) -> None:
            self._in_head, self._boundary, self._head_bytes = True, True, 0
            super().on_message_complete()

        def _refuse_head(self) -> None:
            self._answer_and_close(
                431,
                error_body(
                    431,
                    "request headers exceed the server.max_header_bytes limit",
                    "headers",
                    "headers_too_large",
                ),
            )

        def send_400_response(self, msg: str) -> None:
            # A request httptools cannot parse: uvicorn's own answer is plain text; this one
            # is the error object every other answer of the gateway's is.
            self._answer_and_close(400, error_body(400, msg, None, "invalid_http_request"))

        def _answer_and_close(self, status: int, body: bytes) -> None:
            self.transport.write(
                b"".join(
                    [
                        STATUS_LINE[status],
                        b"content-type: application/json\r\n",
                        b"content-length: " + str(len(body)).encode() + b"\r\n",
                        b"connection: close\r\n\r\n",
                        body,
                    ]
                )
            )
            self.transport.close()

    return BoundedHttpToolsProtocol


class _HeadWithBody:
    """A response cycle's connection until its head is out, as the cycle uses it (`write`,
    `close`, `is_closing`): the first write (the head) is held and sent with the next one, or
    alone by the event loop's next turn, or before a close; then the cycle gets its
    connection back, and later writes go straight to it."""

    __slots__ = ("_cycle", "_head", "_loop", "_transport")

    def __init__(
        self,
        cycle: RequestResponseCycle,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._cycle = cycle
        self._transport = transport
        # The protocol's loop, at hand: asyncio.get_running_loop() costs a getpid() syscall
        # per call on Python 3.11.
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is None:
            self._head = bytes(data)  # uvicorn writes bytes: the same object, no copy
            self._loop.call_soon(self.flush)
            return
        self._head = None
        self._cycle.transport = self._transport
        self._transport.write(head + data)

    def flush(self) -> None:
        """Sends the held head, if any (dropped once the connection is closing: the client
        left, and nothing more goes out on it); the cycle writes to its connection again."""
        self._cycle.transport = self._transport
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()
        self._transport.close()
