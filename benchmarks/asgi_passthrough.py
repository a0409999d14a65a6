"""Reference points for the gateway's design: a bare ASGI pass-through on uvicorn, per HTTP client.

thunder-mw is an ASGI app served by uvicorn that forwards with aiohttp; these pass-throughs
do nothing but forward, so the proxy-overhead benchmark can separate what the server
stack and the client library cost from what thunder-mw's own work costs:
`httpx` (httpx's default transport), `httpx-aiohttp` (httpx's API on the aiohttp
transport, a package of the test extra) and `aiohttp` (aiohttp's client directly, as
thunder-mw forwards). Run it in its own process
(`python -m thunder_mw.benchmarks.asgi_passthrough --client C --upstream URL`); it prints
`PORT <n>` once it listens.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import uvicorn

__all__ = ["CLIENTS", "Message", "PassthroughApp", "main", "serve"]

CLIENTS = ("httpx", "httpx-aiohttp", "aiohttp")
_DROP = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})

Message = dict[str, Any]


class _Upstream:
    """One pooled client to the engine; `open` yields (status, headers, body chunks)."""

    def __init__(self, client: str, upstream: str) -> None:
        self.kind = client
        self.upstream = upstream.rstrip("/")
        self._httpx: httpx.AsyncClient | None = None
        self._aiohttp: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        if self.kind == "httpx":
            self._httpx = httpx.AsyncClient(base_url=self.upstream, limits=limits, timeout=60)
        elif self.kind == "httpx-aiohttp":
            # Imported here: the package is the test extra's, needed by this target alone.
            from httpx_aiohttp import AiohttpTransport

            transport = AiohttpTransport(limits=limits, trust_env=False)
            self._httpx = httpx.AsyncClient(base_url=self.upstream, transport=transport, timeout=60)
        else:
            connector = aiohttp.TCPConnector(limit=512)
            self._aiohttp = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def relay(
        self, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]], send: Any
    ) -> None:
        if self._httpx is not None:
            request = self._httpx.build_request(method, path, content=body, headers=headers)
            response = await self._httpx.send(request, stream=True)
            try:
                kept = [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in _DROP]
                await _relay(send, response.status_code, kept, response.aiter_raw())
            finally:
                await response.aclose()
            return
        assert self._aiohttp is not None
        str_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        async with self._aiohttp.request(
            method, self.upstream + path, data=body, headers=str_headers
        ) as upstream:
            kept = [(k.lower(), v) for k, v in upstream.raw_headers if k.lower() not in _DROP]
            await _relay(send, upstream.status, kept, upstream.content.iter_any())


async def _relay(
    send: Any, status: int, headers: list[tuple[bytes, bytes]], chunks: AsyncIterator[bytes]
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


class PassthroughApp:
    """Forwards every HTTP request, body read whole, response streamed back."""

    def __init__(self, client: str, upstream: str) -> None:
        self.upstream = _Upstream(client, upstream)

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self.upstream.start()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROP]
        await self.upstream.relay(scope["method"], scope["path"], body, headers, send)


def serve(client: str, upstream: str, host: str = "127.0.0.1", port: int = 0) -> None:
    """Listen until interrupted, printing `PORT <n>` on stdout once bound."""
    sock = socket.socket()
    sock.bind((host, port))
    config = uvicorn.Config(
        PassthroughApp(client, upstream), log_level="warning", access_log=False, lifespan="on"
    )
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    # uvicorn picks uvloop and httptools itself when installed, as `thunder-mw serve` does.
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=CLIENTS, required=True)
    parser.add_argument("--upstream", required=True, help="Base URL of the engine.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    serve(args.client, args.upstream, args.host, args.port)


if __name__ == "__main__":
    main()
