"""Pooled keep-alive connections that the server may close while idle: retired before it does,
and when it wins the race anyway, a request lost that way is recognised as safe to resend.

uvicorn (under vLLM and SGLang) closes a connection idle for 5 s; a client pool that keeps it
longer hands a request to a socket the server is closing, and the request fails before any
status line comes back (`ServerDisconnectedError`, `ClientOSError: Can not write request
body`). Keeping connections a little shorter than the server does avoids nearly all of those;
the rest are requests that went out on a REUSED connection and got no answer, which the
server never processed (it closes only idle connections), so one resend on a fresh
connection is safe. (A server that died under the request refuses the fresh connection, and
the caller handles that as any refused connection.) A request that failed on a connection
opened for it is not resent: there the server may have seen it.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any

import aiohttp
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

__all__ = [
    "KeepAliveConnector",
    "forget_reuse",
    "keep_alive_timeout",
    "lost_on_a_reused_connection",
]

# Whether the request being sent in this task went out on a connection from the pool (set by
# the connector as it hands the connection over, read by the sender when the request fails).
_went_out_reused: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "thunder_mw_went_out_reused", default=False
)


class KeepAliveConnector(aiohttp.TCPConnector):
    """A TCPConnector that retires idle connections after `keep_alive_s` (sooner when the
    server says so in `Keep-Alive: timeout=N`) and notes whether each request reused one."""

    def __init__(self, *, keep_alive_s: float, **kwargs: Any) -> None:
        super().__init__(keepalive_timeout=keep_alive_s, **kwargs)
        self.keep_alive_s = keep_alive_s
        # Protocols that have carried a request already; a weak set, so a closed connection
        # leaves it with its protocol.
        self._used: weakref.WeakSet[Any] = weakref.WeakSet()

    async def connect(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109  (aiohttp's signature)
    ) -> Connection:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        if protocol is None:
            return connection
        reused = protocol in self._used
        if not reused:
            self._used.add(protocol)
        _went_out_reused.set(reused)
        return connection

    def honour_keep_alive_header(self, value: str) -> None:
        """A response said `Keep-Alive: timeout=N`: idle connections go before N seconds are
        up (never later than `keep_alive_s`)."""
        server_s = keep_alive_timeout(value)
        if server_s is None:
            return
        retire_s = max(server_s - 1.0, server_s / 2)
        if retire_s < self.keep_alive_s:
            self.keep_alive_s = retire_s
            # aiohttp reads this attribute at every pool checkout and cleanup; it has no
            # public setter, and a new connector would drop the connections in use. Private:
            # checked against aiohttp 3.14.5, pinned by tests/test_framework_pins.py.
            self._keepalive_timeout = retire_s


def keep_alive_timeout(value: str) -> float | None:
    """The `timeout=N` of a Keep-Alive header value, in seconds (None when absent or bad)."""
    for part in value.split(","):
        name, _, number = part.strip().partition("=")
        if name.strip().lower() == "timeout":
            try:
                seconds = float(number.strip())
            except ValueError:
                return None
            return seconds if seconds >= 0 else None
    return None


def lost_on_a_reused_connection(exc: BaseException) -> bool:
    """True when `exc`, raised while sending a request and before its status line, came from
    a pooled connection the server had closed: the request is safe to resend once on a fresh
    connection. Must be called in the task that sent the request."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False  # a new connection failed to open: nothing stale about it
    stale = isinstance(
        exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError | ConnectionResetError
    )
    return stale and _went_out_reused.get()


def forget_reuse() -> None:
    """Clear the note before a new request, so a failure before any connection was handed
    over is not taken for a reused one."""
    _went_out_reused.set(False)
