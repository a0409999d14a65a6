"""The yardstick for proxy overhead: about the cheapest pass-through plain Python can do.

An aiohttp.web server and one pooled aiohttp.ClientSession that copy each request to one
upstream and stream the response back chunk by chunk; no parsing, no scheduling. Run it
in its own process: `python -m thunder_mw.benchmarks.passthrough_proxy --upstream URL`
prints `PORT <n>` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

from thunder_mw.benchmarks.fake_engine import new_event_loop

__all__ = ["main", "make_app", "serve"]

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "host",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
    }
)


def make_app(upstream: str) -> web.Application:
    """An app forwarding every path to `upstream` over one pooled keep-alive session."""
    app = web.Application()
    upstream = upstream.rstrip("/")

    async def start_session(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=512, ttl_dns_cache=None)
        app["session"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close_session(app: web.Application) -> None:
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        async with session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as upstream_response:
            response = web.StreamResponse(
                status=upstream_response.status,
                headers={
                    k: v
                    for k, v in upstream_response.headers.items()
                    if k.lower() not in _HOP_BY_HOP
                },
            )
            await response.prepare(request)
            async for chunk in upstream_response.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.on_startup.append(start_session)
    app.on_cleanup.append(close_session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


async def serve(upstream: str, host: str = "127.0.0.1", port: int = 0) -> None:
    """Listen until cancelled, printing `PORT <n>` on stdout once bound."""
    runner = web.AppRunner(make_app(upstream), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"PORT {bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="Base URL of the engine.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        try:
            runner.run(serve(args.upstream, args.host, args.port))
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
