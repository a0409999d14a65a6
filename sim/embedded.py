"""Simulated engines served inside the caller's event loop (the demo's `type: sim` backends)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
from collections.abc import Generator

import uvicorn

from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.server import create_sim_app

__all__ = ["STOP_GRACE_S", "STOP_MARGIN_S", "EmbeddedEngine"]

log = logging.getLogger("thunder_mw.sim")

# When an engine stops, its open requests are the host's, which has already given up on
# them (it closes its clients to the engine first): they get this long, then are cancelled.
STOP_GRACE_S = 1.0
# The engine's own shutdown (its lifespan) after that, before its server task is cancelled.
STOP_MARGIN_S = 2.0

# Set inside an embedded server's tasks: uvicorn logs their start and stop through the
# `uvicorn.error` logger the host's own server shares.
_IN_EMBEDDED_SERVER: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "thunder_mw_in_embedded_server", default=False
)


class _EmbeddedServerChatter(logging.Filter):
    """Drops uvicorn's INFO lines ("Started server process", "Shutting down", ...) that an
    embedded server logs, so that the host's own lines (among them where it listens) are the
    only ones of their kind; warnings and errors of embedded servers still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not _IN_EMBEDDED_SERVER.get()


def _quiet_embedded_servers() -> None:
    shared = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _EmbeddedServerChatter) for f in shared.filters):
        shared.addFilter(_EmbeddedServerChatter())


class _HostLoggingConfig(uvicorn.Config):
    """uvicorn.Config configures the process-wide `uvicorn.*` loggers (their level, the
    access log's handlers) when it is built: the host's server already did, and an embedded
    engine built later must not undo it (it once lowered `uvicorn.error` to WARNING, hiding
    where the gateway listens)."""

    def configure_logging(self) -> None:
        pass


class _SignalFreeServer(uvicorn.Server):
    """The host process owns signals: an embedded server must not take SIGTERM/SIGINT from
    it (the host's shutdown stops this server through its lifespan)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def _serve_quietly(server: uvicorn.Server, sock: socket.socket) -> None:
    _IN_EMBEDDED_SERVER.set(True)  # this task's context only, and the tasks it starts
    await server.serve(sockets=[sock])


class EmbeddedEngine:
    """One simulated engine on a free loopback port, run as a task of the current event loop."""

    def __init__(self, settings: SimEngineSettings, host: str = "127.0.0.1") -> None:
        self.settings = settings
        self.host = host
        self.app = create_sim_app(settings)
        self.url: str | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Serve the engine; returns its base URL once it accepts connections."""
        if self.url is not None:
            return self.url
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        port = sock.getsockname()[1]
        _quiet_embedded_servers()
        config = _HostLoggingConfig(
            self.app,
            log_level=None,
            access_log=False,
            lifespan="on",
            # uvicorn's own bound on open requests at shutdown (None would wait for ever).
            timeout_graceful_shutdown=STOP_GRACE_S,  # type: ignore[arg-type]  # a float works
        )
        server = _SignalFreeServer(config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(_serve_quietly(server, sock))
        while not server.started:
            if self._task.done():
                sock.close()
                await self._task  # re-raises the start-up failure
                raise RuntimeError("simulated engine stopped during start-up")
            await asyncio.sleep(0.01)
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving, within STOP_GRACE_S + STOP_MARGIN_S (and a moment for a cancelled
        server task to unwind): open requests are cut off, whatever they are doing."""
        server, task = self._server, self._task
        if server is None or task is None:
            return
        self._server = None
        self._task = None
        self.url = None
        server.should_exit = True
        # asyncio.wait neither raises the task's error nor swallows the caller's cancellation.
        await asyncio.wait({task}, timeout=STOP_GRACE_S + STOP_MARGIN_S)
        if not task.done():
            log.warning(
                "simulated engine on %s did not stop within %.0f s: cancelled",
                self.host,
                STOP_GRACE_S + STOP_MARGIN_S,
            )
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_MARGIN_S)
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("simulated engine stopped with an error: %r", task.exception())
