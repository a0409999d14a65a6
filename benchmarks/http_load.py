"""A closed-loop HTTP/1.1 load generator cheap enough not to be the bottleneck of a proxy benchmark.

Each worker owns one keep-alive connection (a raw asyncio Protocol, no client library) and
sends pre-encoded requests back to back; latency runs from the write of the request to
the last byte of the response (for a stream: the terminating chunk). A request that meets a
keep-alive connection the server closed before any byte of its answer is sent once more on
a new connection (the server saw nothing of it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

__all__ = ["LoadResult", "Response", "closed_loop", "connect", "fetch"]


@dataclass
class LoadResult:
    """What one measured window produced."""

    requests: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    first_error: str | None = None
    server_cpu_s: float | None = None  # CPU the measured server spent inside the window

    @property
    def req_per_s(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes  # the raw body: for chunked responses the chunk payloads joined


class _Connection(asyncio.Protocol):
    """One keep-alive connection answering one request at a time (Content-Length or chunked)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self.answered = 0  # responses completed on this connection
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._body_start = -1
        # Neither Content-Length nor chunked: taken as an empty body (every server here sends one).
        self._length = -1
        self._chunked = False
        self._pos = 0
        self._parts: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"connection lost: {exc}"))
        self._transport = None

    def request(self, data: bytes) -> asyncio.Future[Response]:
        if self._transport is None:
            raise ConnectionError("connection closed")
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(data)
        return self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        response = self._parse()
        if response is not None and self._waiter is not None and not self._waiter.done():
            self.answered += 1
            self._waiter.set_result(response)

    @property
    def stale(self) -> bool:
        """Closed after answering before, with nothing of the next answer read: the server
        closed it as idle, so a request it failed was never seen."""
        return self._transport is None and self.answered > 0 and not self._buf

    def _parse(self) -> Response | None:
        buf = self._buf
        if self._body_start < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return None
            lines = bytes(buf[:end]).split(b"\r\n")
            self._status = int(lines[0].split(b" ", 2)[1])
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    self._length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    self._chunked = True
            self._body_start = self._pos = end + 4
        if not self._chunked:
            end = self._body_start + max(self._length, 0)
            if len(buf) < end:
                return None
            response = Response(self._status, bytes(buf[self._body_start : end]))
            del buf[:end]
            self._reset()
            return response
        pos = self._pos
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            if size == 0:
                trailer_end = buf.find(b"\r\n\r\n", eol)
                if trailer_end < 0:
                    break
                response = Response(self._status, b"".join(self._parts))
                del buf[: trailer_end + 4]
                self._reset()
                return response
            if len(buf) < eol + 2 + size + 2:
                break
            self._parts.append(bytes(buf[eol + 2 : eol + 2 + size]))
            pos = eol + 2 + size + 2
        self._pos = pos
        return None


async def connect(host: str, port: int) -> _Connection:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(_Connection, host, port)
    return protocol


async def fetch(host: str, port: int, data: bytes) -> Response:
    """One request on a fresh connection (for correctness probes, not for load)."""
    conn = await connect(host, port)
    try:
        return await conn.request(data)
    finally:
        conn.close()


def _check(response: Response, stream: bool) -> str | None:
    if response.status != 200:
        return f"status {response.status}: {response.body[:200]!r}"
    if stream and b"[DONE]" not in response.body[-64:]:
        return f"stream did not end with [DONE]: {response.body[-200:]!r}"
    return None


async def closed_loop(
    host: str,
    port: int,
    requests_per_worker: Sequence[bytes],
    *,
    stream: bool,
    warmup_s: float,
    duration_s: float,
    server_cpu: Callable[[], float | None] | None = None,
) -> LoadResult:
    """Run one worker per request in `requests_per_worker` back to back; measure a window.

    Only requests that both start and finish inside the window count, so neither the
    warm-up nor the drain at the end leaks into req/s or latency. `server_cpu`, when
    given, reads the server's CPU seconds so far; the window's share is recorded.
    """
    conns = [await connect(host, port) for _ in requests_per_worker]
    result = LoadResult()
    window = [float("inf"), float("inf")]
    stop = asyncio.Event()
    clock = time.perf_counter

    async def worker(conn: _Connection, data: bytes) -> None:
        latencies = result.latencies_s
        while not stop.is_set():
            t0 = clock()
            try:
                try:
                    response = await conn.request(data)
                except ConnectionError:
                    if not conn.stale:
                        raise
                    conn = await connect(host, port)
                    conns.append(conn)
                    response = await conn.request(data)
            except ConnectionError as exc:
                result.errors += 1
                result.first_error = result.first_error or str(exc)
                return
            t1 = clock()
            problem = _check(response, stream)
            if problem is not None:
                result.errors += 1
                result.first_error = result.first_error or problem
            elif t0 >= window[0] and t1 <= window[1]:
                result.requests += 1
                latencies.append(t1 - t0)

    tasks = [
        asyncio.create_task(worker(c, d)) for c, d in zip(conns, requests_per_worker, strict=True)
    ]
    try:
        await asyncio.sleep(warmup_s)
        cpu_before = server_cpu() if server_cpu else None
        window[0] = clock()
        window[1] = window[0] + duration_s
        await asyncio.sleep(duration_s)
        cpu_after = server_cpu() if server_cpu else None
        if cpu_before is not None and cpu_after is not None:
            result.server_cpu_s = cpu_after - cpu_before
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    finally:
        for t in tasks:
            t.cancel()
        for c in conns:
            c.close()
    result.elapsed_s = duration_s
    return result
