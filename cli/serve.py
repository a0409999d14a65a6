"""`thunder-mw serve`: the gateway under uvicorn, with its head bound, logging and shutdown."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from thunder_mw.cli._shutdown import AnswerCutOffCalls, exit_now
from thunder_mw.cli.config_loader import ConfigError, load_config
from thunder_mw.schemas.config import ThunderConfig

__all__ = [
    "DEMO_CONFIG",
    "STOP_RESERVE_S",
    "YOUNG_GC_THRESHOLD",
    "GatewayServer",
    "base_url",
    "calls_shutdown_s",
    "listening_socket",
    "serve",
]

log = logging.getLogger("thunder_mw")

# Allocations between young-generation collections (CPython's default is 700).
YOUNG_GC_THRESHOLD = 20_000
# Of `server.shutdown_timeout_s`, what the gateway's own stop (tools, engine clients,
# embedded engines) keeps for itself after running calls have had theirs.
STOP_RESERVE_S = 5.0
# The config `serve` runs without --config: shipped as package data (pyproject.toml).
DEMO_CONFIG = "config/demo.yaml"


def serve(args: argparse.Namespace) -> int:
    from thunder_mw.middleware.app import create_app

    overrides: dict[str, Any] = {}
    for key in ("host", "port", "log_level"):
        if getattr(args, key, None) is not None:
            overrides.setdefault("server", {})[key] = getattr(args, key)
    try:
        with _config_path(args.config) as path:
            config = load_config(path, overrides)
    except ConfigError as exc:
        return exc.report()
    from thunder_mw.cli.bounded_head import bounded_httptools, raw_head_limit
    from thunder_mw.observability.log_format import configure_logging
    from thunder_mw.observability.redaction import config_secrets
    from thunder_mw.observability.redaction import install as install_redaction

    level = config.server.log_level
    configure_logging(level, config.observability.log_format)
    if args.config is None:
        log.warning(
            "no --config given: serving the built-in demo (%s) on SIMULATED engines, whose "
            "answers are made up; `thunder-mw serve --config PATH` serves real engines",
            DEMO_CONFIG,
        )
    app = create_app(config)
    stopping = threading.Event()
    calls_s = calls_shutdown_s(config.server.shutdown_timeout_s)
    server_config = uvicorn.Config(
        AnswerCutOffCalls(app, stopping.is_set),
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
        timeout_keep_alive=config.server.client_keep_alive_s,  # type: ignore[arg-type]
        # uvicorn's own bound on running calls at shutdown; they are cancelled past it.
        timeout_graceful_shutdown=calls_s,  # type: ignore[arg-type]  # a float works too
    )
    # uvicorn.Config has just installed its loggers' handlers: every handler gets the filter.
    install_redaction(config_secrets(config))
    # Bound before the engines are probed: a taken port is the first and only thing reported.
    try:
        sock = listening_socket(config.server.host, config.server.port)
    except OSError as exc:
        log.error(
            "cannot listen on %s: %s (server.host, server.port; `--port N` picks another)",
            base_url(config.server.host, config.server.port),
            exc.strerror or exc,
        )
        return 1

    def draining() -> None:
        stopping.set()
        app.core.scheduler.drain()

    server = GatewayServer(
        server_config,
        on_exit=draining,
        shutdown_timeout_s=config.server.shutdown_timeout_s,
        listening=lambda url: _log_listening(url, config),
    )
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled, once it has stopped
        return 128 + signal.SIGINT
    return 0 if server.started else 1


@contextlib.contextmanager
def _config_path(given: str | None) -> Iterator[str | Path]:
    if given is not None:
        yield given
        return
    with resources.as_file(resources.files("thunder_mw").joinpath(DEMO_CONFIG)) as path:
        yield path


def calls_shutdown_s(shutdown_timeout_s: float) -> float:
    """How long running calls get to finish at shutdown: all of `server.shutdown_timeout_s`
    but STOP_RESERVE_S, or half of it when it is short."""
    return max(shutdown_timeout_s - STOP_RESERVE_S, shutdown_timeout_s / 2)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening: connections are refused until the
    gateway has started), as uvicorn.Config.bind_socket makes it, without its sys.exit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _log_listening(url: str, config: ThunderConfig) -> None:
    token = "?token=<admin token>" if config.server.admin_token else ""
    log.info(
        "thunder-mw listening on %s (dashboard: %s/dashboard%s); Ctrl-C or SIGTERM stops it",
        url,
        url,
        token,
    )


class GatewayServer(uvicorn.Server):
    """uvicorn, plus: the gateway's socket is bound before it starts; on SIGTERM/SIGINT
    `on_exit` runs (held requests are answered with 503 at once), running calls get uvicorn's
    graceful-shutdown deadline, and the whole process exits within `shutdown_timeout_s`
    whatever is still running; a second signal exits at once; and the garbage collector is
    tuned for a long-lived proxy once the gateway has started."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_exit: Callable[[], None],
        shutdown_timeout_s: float,
        listening: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._shutdown_timeout_s = shutdown_timeout_s
        self._listening = listening
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadline: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._deadline is not None:
            exit_now(128 + sig, "%s again: exiting now", signal.Signals(sig).name)
        # A thread, not the event loop: it fires even while the loop is stuck.
        self._deadline = threading.Timer(self._shutdown_timeout_s, self._deadline_passed)
        self._deadline.daemon = True
        self._deadline.start()
        if self._loop is not None and not self.should_exit:
            self._loop.call_soon_threadsafe(self._on_exit)
        super().handle_exit(sig, frame)

    def _deadline_passed(self) -> None:
        exit_now(
            1,
            "shutdown still unfinished after server.shutdown_timeout_s (%g s): exiting, "
            "abandoning what is still running",
            self._shutdown_timeout_s,
        )

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await super().serve(sockets)
        finally:
            if self._deadline is not None:
                self._deadline.cancel()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        if self._listening is not None:
            port = self.servers[0].sockets[0].getsockname()[1]  # server.port 0: the one picked
            self._listening(base_url(self.config.host, port))
        # Everything allocated at start-up (config, routes, metric families, the simulator's
        # tables) lives as long as the process: frozen, collections stop re-walking it. Each
        # request allocates a few hundred short-lived objects; at CPython's default of 700
        # allocations per young collection the collector ran several times per request and
        # cost ~15 % of the gateway's CPU (results/proxy-overhead.json, notes).
        gc.freeze()
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
