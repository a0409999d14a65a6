"""Runs ASGI apps on real loopback sockets in background threads, for tests that need TCP."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, Self, TypeVar

import uvicorn

from support.polling import wait_until
from thunder_mw.middleware.app import create_app
from thunder_mw.middleware.types import ASGIApp
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.sim.ports import free_port

__all__ = ["ServerThread", "free_port", "serving", "serving_gateway"]

T = TypeVar("T")


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 in a thread with its own event loop."""

    def __init__(self, app: ASGIApp, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                lifespan="on",
                loop="asyncio",
                access_log=False,
            )
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # The Runner closes the loop (and what is left on it) once the server has stopped.
        with asyncio.Runner() as runner:
            self.loop = runner.get_loop()
            runner.run(self.server.serve())

    def start(self) -> Self:
        self._thread.start()

        def started() -> bool:
            if not self._thread.is_alive():
                raise RuntimeError("server thread died during startup")
            return self.server.started

        # 20 s: a loaded 2-core machine (CI beside other jobs) has been seen past 5 s.
        wait_until(started, 20, interval_s=0.01, message=f"the server on {self.url} to start")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)


@contextlib.contextmanager
def serving(app: ASGIApp, port: int | None = None) -> Iterator[ServerThread]:
    server = ServerThread(app, port).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def serving_gateway(
    engine: ASGIApp, backend: dict[str, Any] | None = None, **config: Any
) -> Iterator[ServerThread]:
    """`engine` and a thunder-mw gateway in front of it, each on a loopback port.

    `backend` adds to the one backend's settings (named "e"); `config` sets the rest of the
    gateway's configuration (`server`, `policies`, ...).
    """
    with serving(engine) as engine_server:
        settings = ThunderConfig(
            backends=[{"name": "e", "url": engine_server.url, **(backend or {})}], **config
        )
        with serving(create_app(settings)) as gateway:
            yield gateway
