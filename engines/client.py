"""The one HTTP client of an engine, on aiohttp: forwarded calls (the data plane) on pooled
keep-alive HTTP/1.1, and probes, model lists and admin calls (the control plane).

The hot path does not go through httpx: `results/proxy-overhead.json` measures
the httpx API (even on its aiohttp transport) at about half the throughput of aiohttp used
directly, which is the one per-request cost a Python pass-through cannot hide. The control
plane takes the same client rather than a second stack: one library, one set of errors and
timeouts, one place that knows how an engine's connections behave.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
import msgspec

from thunder_mw.engines.pooled_connections import (
    KeepAliveConnector,
    forget_reuse,
    lost_on_a_reused_connection,
)

__all__ = [
    "STREAM_ERRORS",
    "ControlAnswer",
    "EngineClient",
    "UpstreamError",
    "UpstreamResponse",
    "as_upstream_error",
    "control_request",
]


class UpstreamError(Exception):
    """The engine failed; `before_any_byte` is True when nothing reached it (safe to retry)."""

    def __init__(self, message: str, before_any_byte: bool = False, timeout: bool = False) -> None:
        super().__init__(message)
        self.before_any_byte = before_any_byte
        self.timeout = timeout


class UpstreamResponse:
    """An engine's answer whose body is read (or streamed) by the caller, then closed."""

    __slots__ = ("_deadline", "_first_byte_timeout_s", "_response", "headers", "status")

    def __init__(
        self, response: aiohttp.ClientResponse, deadline: float, first_byte_timeout_s: float
    ) -> None:
        self._response = response
        self._deadline = deadline
        self._first_byte_timeout_s = first_byte_timeout_s
        self.status = response.status
        self.headers: Sequence[tuple[bytes, bytes]] = response.raw_headers

    @property
    def content_type(self) -> str:
        return self._response.content_type

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(
                f"engine failed mid-response: {exc!r}", timeout=_is_timeout(exc)
            ) from exc

    async def first_chunk(self) -> bytes:
        """The body's first bytes (b"" when it is empty), within the first-byte deadline:
        an engine streams its headers at once but may sit on the first event for minutes."""
        content = self._response.content
        try:
            # What already came with the headers (a short answer comes whole) is taken
            # without arming the deadline's timer (~4 us per stream).
            chunk = content.read_nowait()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(
                f"engine failed before its first event: {exc!r}", timeout=_is_timeout(exc)
            ) from exc
        if chunk or content.at_eof():
            return chunk
        try:
            async with asyncio.timeout_at(self._deadline) as deadline:
                return await content.readany()
        except (TimeoutError, aiohttp.ClientError) as exc:
            if deadline.expired():
                raise _no_first_byte(self._first_byte_timeout_s) from exc
            raise UpstreamError(
                f"engine failed before its first event: {exc!r}", timeout=_is_timeout(exc)
            ) from exc

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (after `first_chunk`, if it was read), no re-chunking.
        Iterated on the hot path without a wrapping generator: callers catch STREAM_ERRORS
        and map them with as_upstream_error."""
        return self._response.content.iter_any()

    def at_eof(self) -> bool:
        """The whole body has arrived and been read: no chunk is left to come."""
        return self._response.content.at_eof()

    def close(self) -> None:
        # Closing (not releasing) an unfinished response drops its connection, which is how
        # the engine learns the client went away and aborts the request.
        self._response.close()

    def release(self) -> None:
        self._response.release()


class ControlAnswer(msgspec.Struct, frozen=True):
    """A control-plane answer, read whole."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


async def control_request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, str] | None = None,
    json: Any = None,
    connect_timeout_s: float | None = None,
) -> ControlAnswer:
    """One call whose whole answer is read (decompressed: a /metrics page may come gzipped);
    a failure to connect, a timeout (`connect_timeout_s`, default `timeout_s`, to connect,
    then `timeout_s` between bytes) or a broken answer is an UpstreamError. `json`: a body to
    encode (None: no body)."""
    data = None if json is None else msgspec.json.encode(json)
    sent = dict(headers or {})
    if data is not None:
        sent.setdefault("Content-Type", "application/json")
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=connect_timeout_s or timeout_s, sock_read=timeout_s
    )
    try:
        async with session.request(
            method,
            url,
            params=query,
            data=data,
            headers=sent,
            timeout=timeout,
            allow_redirects=False,
            auto_decompress=True,
        ) as response:
            return ControlAnswer(response.status, await response.read())
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamError(f"connection refused: {exc!r}", before_any_byte=True) from exc
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise UpstreamError(f"{method} {url}: {exc!r}", timeout=_is_timeout(exc)) from exc


class EngineClient:
    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        first_byte_timeout_s: float = 300.0,
        keep_alive_s: float = 4.0,
    ) -> None:
        self.base_url = base_url
        self._max_connections = max_connections
        self._first_byte_timeout_s = first_byte_timeout_s
        self._keep_alive_s = keep_alive_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        # The loop the forwarding session runs on, taken when it is made (on Python 3.11
        # each asyncio.get_running_loop() costs a getpid() syscall).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connector: KeepAliveConnector | None = None
        self._fresh_session: aiohttp.ClientSession | None = None
        # Calls resent on a fresh connection after their pooled one turned out closed.
        self.stale_retries = 0

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._connector = KeepAliveConnector(
                keep_alive_s=self._keep_alive_s,
                limit=self._max_connections,
                limit_per_host=self._max_connections,
                ttl_dns_cache=300,
            )
            self._session = self._new_session(self._connector)
            self._loop = asyncio.get_running_loop()
        return self._session

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    def _fresh(self) -> aiohttp.ClientSession:
        """A session whose every request opens its own connection: the resend of a call lost
        on a stale pooled connection must not draw another stale one from the same pool."""
        if self._fresh_session is None:
            self._fresh_session = self._new_session(aiohttp.TCPConnector(force_close=True))
        return self._fresh_session

    async def send(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        """Send a request and return once the engine's status line and headers arrived.

        The first-byte deadline starts now and covers the headers; the response carries it
        on to `first_chunk`. Cancelling the wait drops the connection: the engine aborts."""
        session = self._ensure_session()
        header_pairs = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers]
        assert self._loop is not None
        deadline = self._loop.time() + self._first_byte_timeout_s
        url = self.base_url + target

        def request(via: aiohttp.ClientSession) -> Any:
            return via.request(
                method, url, data=body, headers=header_pairs, allow_redirects=False, compress=None
            )

        try:
            async with asyncio.timeout_at(deadline) as first_byte:
                forget_reuse()
                try:
                    response = await request(session)
                except (aiohttp.ClientError, OSError) as exc:
                    if not lost_on_a_reused_connection(exc):
                        raise
                    # The engine closed this idle connection as the call went out: it saw
                    # nothing, so the call is sent again, once, on a connection of its own.
                    self.stale_retries += 1
                    response = await request(self._fresh())
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(f"connection refused: {exc!r}", before_any_byte=True) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            if first_byte.expired():
                raise _no_first_byte(self._first_byte_timeout_s) from exc
            raise UpstreamError(f"engine failed: {exc!r}", timeout=_is_timeout(exc)) from exc
        keep_alive = response.headers.get("Keep-Alive")
        if keep_alive is not None and self._connector is not None:
            self._connector.honour_keep_alive_header(keep_alive)
        return UpstreamResponse(response, deadline, self._first_byte_timeout_s)

    async def control(
        self,
        method: str,
        target: str,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        json: Any = None,
        connect_timeout_s: float | None = None,
    ) -> ControlAnswer:
        """A control-plane call (a probe, the model list, a pause or weight update).

        It goes on a connection of its own (the session resends use), not the forwarding
        pool, for two reasons: a probe must never queue behind forwarded calls for a pooled
        connection (a pool full of long streams would time out /health and take a busy but
        healthy engine out), nor go out on an idle one the engine is closing (the failed
        probe would do the same). A few connections per `probe_interval_s` cost nothing;
        this keeps one pool of kept-alive connections per engine, the data plane's."""
        return await control_request(
            self._fresh(),
            method,
            self.base_url + target,
            timeout_s=timeout_s,
            headers=headers,
            query=query,
            json=json,
            connect_timeout_s=connect_timeout_s,
        )

    async def get(
        self,
        target: str,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float | None = None,
    ) -> ControlAnswer:
        return await self.control(
            "GET", target, timeout_s=timeout_s, headers=headers, connect_timeout_s=connect_timeout_s
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._fresh_session is not None:
            await self._fresh_session.close()
            self._fresh_session = None
        # A closed connection's transport lets go of its socket on the loop's next turn
        # (asyncio's `connection_lost` callback, aiohttp's "graceful shutdown" note): give it
        # those turns (two: the close, then its callback), or a loop that ends right after
        # this leaks the socket.
        for _ in range(2):
            await asyncio.sleep(0)


STREAM_ERRORS = (TimeoutError, aiohttp.ClientError)


def as_upstream_error(exc: BaseException, what: str) -> UpstreamError:
    return UpstreamError(f"{what}: {exc!r}", timeout=_is_timeout(exc))


def _no_first_byte(timeout_s: float) -> UpstreamError:
    return UpstreamError(
        f"no response within {timeout_s:g} s (server.first_byte_timeout_s)", timeout=True
    )


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError)
