"""Simulated engines served inside the caller's event loop (the demo's `type: sim` backends)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator

import uvicorn

from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.server import create_sim_app


class _SignalFreeServer(uvicorn.Server):
    """The host process owns signals: an embedded server must not take SIGTERM/SIGINT from
    it (the host's shutdown stops this server through its lifespan)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


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
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on")
        server = _SignalFreeServer(config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._task.done():
                sock.close()
                await self._task  # re-raises the start-up failure
                raise RuntimeError("simulated engine stopped during start-up")
            await asyncio.sleep(0.01)
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving and wait for the server task (open requests are cut off)."""
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._server = None
        self._task = None
        self.url = None
