"""`thunder-mw serve`: the gateway under uvicorn, with its head bound, logging and shutdown."""

from __future__ import annotations

import argparse
import asyncio
import gc
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from thunder_mw.cli.config_loader import ConfigError, load_config

# Allocations between young-generation collections (CPython's default is 700).
YOUNG_GC_THRESHOLD = 20_000


def serve(args: argparse.Namespace) -> int:
    from thunder_mw.middleware.app import create_app

    overrides: dict[str, Any] = {}
    for key in ("host", "port", "log_level"):
        if getattr(args, key, None) is not None:
            overrides.setdefault("server", {})[key] = getattr(args, key)
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        return exc.report()
    from thunder_mw.cli.bounded_head import bounded_httptools, raw_head_limit
    from thunder_mw.observability.log_format import configure_logging
    from thunder_mw.observability.redaction import config_secrets
    from thunder_mw.observability.redaction import install as install_redaction

    level = config.server.log_level
    configure_logging(level, config.observability.log_format)
    app = create_app(config)
    server_config = uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        log_level=level,
        loop="uvloop",
        http=bounded_httptools(
            raw_head_limit(config.server.max_header_bytes, config.server.max_headers)
        ),
        lifespan="on",
        access_log=config.observability.access_log,
        # JSON logs: uvicorn's own loggers go through the same root handler.
        log_config=None if config.observability.log_format == "json" else LOGGING_CONFIG,
        proxy_headers=False,
        server_header=False,
        # Idle client connections outlive the clients' own pools, so clients close them first.
        # (uvicorn schedules it with call_later: fractions of a second work, its hint says int)
        timeout_keep_alive=config.server.keep_alive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=30,
    )
    # uvicorn.Config has just installed its loggers' handlers: every handler gets the filter.
    install_redaction(config_secrets(config))
    server = GatewayServer(app, server_config)
    server.run()
    return 0 if server.started else 1


class GatewayServer(uvicorn.Server):
    """uvicorn, plus: on SIGTERM/SIGINT held requests are answered with 503 at once, while
    streams already running get uvicorn's graceful-shutdown deadline to finish; and the
    garbage collector is tuned for a long-lived proxy once the gateway has started."""

    def __init__(self, app: Any, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._gateway = app

    def handle_exit(self, sig: int, frame: Any) -> None:
        loop = self._loop
        if loop is not None and not self.should_exit:
            loop.call_soon_threadsafe(self._gateway.core.scheduler.drain)
        super().handle_exit(sig, frame)

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        # Everything allocated at start-up (config, routes, metric families, the simulator's
        # tables) lives as long as the process: frozen, collections stop re-walking it. Each
        # request allocates a few hundred short-lived objects; at CPython's default of 700
        # allocations per young collection the collector ran several times per request and
        # cost ~15 % of the gateway's CPU (benchmarks/results/proxy-overhead.json, notes).
        gc.freeze()
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])

    _loop: asyncio.AbstractEventLoop | None = None
