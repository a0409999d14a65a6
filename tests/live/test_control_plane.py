"""The control plane (probes, model lists, admin calls) on the engine client's own
connections: it never waits behind forwarded calls, and it speaks as the engines expect."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from thunder_mw.engines.client import UpstreamError
from thunder_mw.engines.pool import BackendPool
from thunder_mw.schemas.config import BackendSettings, ServerSettings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class HangingEngine:
    """Answers GETs at once; a POST is read and never answered (its connection stays busy).
    Records each request's line, headers and body."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.url = ""
        self.posted = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            while line := await reader.readline():
                headers: dict[str, str] = {}
                while (header := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.requests.append((line.decode().strip(), headers, body))
                if line.startswith(b"POST /v1/"):
                    self.posted.set()
                    await asyncio.sleep(3600)
                answer = b'{"data": []}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%b" % (len(answer), answer)
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> HangingEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        for writer in self._writers:
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        self._handlers.clear()
        await self._server.wait_closed()


@pytest.fixture
async def pooled() -> AsyncIterator[tuple[HangingEngine, BackendPool]]:
    async with HangingEngine() as engine:
        server = ServerSettings(
            probe_interval_s=3600, max_connections_per_backend=1, connect_timeout_s=1.0
        )
        backend = BackendSettings(name="e", url=engine.url, api_key="sk-engine")
        pool = BackendPool([backend], server)
        await pool.start()
        try:
            yield engine, pool
        finally:
            await pool.stop()


@pytest.mark.anyio
async def test_a_probe_does_not_wait_behind_forwarded_calls_for_a_pooled_connection(
    pooled: tuple[HangingEngine, BackendPool],
) -> None:
    engine, pool = pooled
    backend = pool.get("e")
    assert backend is not None and backend.engine is not None and backend.healthy
    headers = [(b"content-type", b"application/json")]
    call = asyncio.create_task(backend.engine.send("POST", "/v1/chat/completions", headers, b"{}"))
    try:
        await asyncio.wait_for(engine.posted.wait(), timeout=3)  # the pool's one connection
        await asyncio.wait_for(pool.probe(backend), timeout=3)
        assert backend.healthy and not call.done()
    finally:
        call.cancel()


@pytest.mark.anyio
async def test_admin_calls_carry_the_engine_key_a_json_body_and_the_query(
    pooled: tuple[HangingEngine, BackendPool],
) -> None:
    engine, pool = pooled
    backend = pool.get("e")
    assert backend is not None and backend.engine is not None
    answer = await backend.engine.control(
        "POST",
        "/pause",
        query={"mode": "keep"},
        json={"a": 1},
        headers=backend.control_headers,
        timeout_s=2,
    )
    assert answer.status == 200
    line, headers, body = engine.requests[-1]
    assert line == "POST /pause?mode=keep HTTP/1.1"
    assert headers["authorization"] == "Bearer sk-engine"
    assert headers["content-type"] == "application/json" and body == b'{"a":1}'
    # The model list a probe reads carries the key too; /health and /metrics go without.
    probed = {line.split()[1]: h for line, h, _ in engine.requests if line.startswith("GET")}
    assert probed["/v1/models"]["authorization"] == "Bearer sk-engine"
    assert "authorization" not in probed["/health"]


@pytest.mark.anyio
async def test_an_engine_that_refuses_connections_is_an_upstream_error(
    pooled: tuple[HangingEngine, BackendPool],
) -> None:
    engine, pool = pooled
    backend = pool.get("e")
    assert backend is not None and backend.engine is not None
    await engine.__aexit__()
    await asyncio.sleep(0.05)
    with pytest.raises(UpstreamError) as info:
        await backend.engine.get("/health", timeout_s=1)
    assert info.value.before_any_byte
