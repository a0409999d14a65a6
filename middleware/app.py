"""The two apps over the composed gateway (middleware/_compose.py): the standalone gateway,
and ThunderMiddleware for gateway mode.

Standalone:  admin routes | AgentContextMiddleware → SchedulingMiddleware → Forwarder
Gateway:     admin routes | AgentContextMiddleware → SchedulingMiddleware → the user's app
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from thunder_mw._version import __version__
from thunder_mw.middleware._admin import is_admin_path
from thunder_mw.middleware._compose import Components, compose
from thunder_mw.middleware.call_state import STATE_KEY, CallState
from thunder_mw.middleware.errors import send_error
from thunder_mw.middleware.types import ASGIApp, Message, Receive, Scope, Send
from thunder_mw.schemas.config import ThunderConfig

__all__ = ["ThunderGateway", "ThunderMiddleware", "create_app"]

log = logging.getLogger("thunder_mw")


class _Core:
    """What both modes share: the composed components' lifecycle and the request entry."""

    def __init__(self, parts: Components) -> None:
        self.pool = parts.pool
        self.scheduler = parts.scheduler
        self.metrics = parts.metrics
        self.tools = parts.tools
        self.observability = parts.observability
        self.prefiller = parts.prefiller
        self.owners = parts.owners
        self.context_layer = parts.context_layer
        self.pipeline: ASGIApp = parts.context_layer
        self.fleet = parts.fleet
        self.admin = parts.admin
        self.max_header_bytes = parts.config.server.max_header_bytes
        self.max_headers = parts.config.server.max_headers
        self.started = False
        self._starting: asyncio.Lock | None = None

    async def startup(self) -> None:
        if self.started:
            return
        await self.pool.start()
        await self.scheduler.start()
        await self.observability.start()
        if self.tools is not None:
            await self.tools.start()
        self.started = True
        log.info(
            "thunder-mw %s: %d backend(s), %d healthy",
            __version__,
            len(self.pool.backends),
            len(self.pool.healthy_labels()),
        )

    async def shutdown(self) -> None:
        if self.started:
            self.started = False
            if self.tools is not None:
                await self.tools.stop()
            await self.observability.stop()
            if self.prefiller is not None:
                await self.prefiller.stop()
            await self.fleet.stop()
            await self.scheduler.stop()
            await self.pool.stop()

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self._head_refused(scope)
        if refused is not None:
            message, code = refused
            await send_error(send, 431, message, "headers", code)
            self.metrics.count_request(scope["path"], 431)
            return
        if not self.started:
            # Servers (and test transports) that skip the lifespan protocol still get a
            # started gateway: the first request starts it.
            self._starting = self._starting or asyncio.Lock()
            async with self._starting:
                await self.startup()
        path = scope["path"]
        if is_admin_path(path):
            await self.admin(scope, receive, send)
            return
        call = CallState(time.perf_counter())
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state[STATE_KEY] = call

        async def watching_send(message: Message) -> None:
            # The one wrapper of `send` on the hot path: records the status for metrics and
            # the time to first token, and ends the call before its last byte goes out.
            if message["type"] == "http.response.start":
                call.status = message["status"]
            else:
                if call.first_body_at is None and message.get("body"):
                    call.first_body_at = time.perf_counter()
                if not message.get("more_body", False):
                    call.end(answered=True)
            await send(message)

        try:
            await self.pipeline(scope, receive, watching_send)
        except Exception:
            if call.status:
                raise  # the answer is under way: the server closes the connection
            # A bug (ours, or a wrapped app's) is still answered in the error shape clients
            # parse, not with the server's plain-text 500.
            log.exception("unhandled error answering %s %s", scope["method"], path)
            await send_error(
                watching_send,
                500,
                "the gateway failed to answer this request (its log has the error)",
                None,
                "internal_error",
            )
        finally:
            self.metrics.count_request(path, call.status)

    def _head_refused(self, scope: Scope) -> tuple[str, str] | None:
        """431 for a request head past the configured bounds (uvicorn's httptools parser
        enforces none), checked before any layer looks at a header."""
        headers = scope["headers"]
        if len(headers) > self.max_headers:
            return (
                f"request has {len(headers)} headers; at most {self.max_headers} are accepted "
                "(server.max_headers)",
                "too_many_headers",
            )
        size = len(scope.get("raw_path") or scope["path"]) + len(scope.get("query_string", b""))
        for name, value in headers:
            size += len(name) + len(value)
        if size > self.max_header_bytes:
            return (
                f"request headers and target exceed the {self.max_header_bytes}-byte limit "
                "(server.max_header_bytes)",
                "headers_too_large",
            )
        return None


class ThunderGateway:
    """The standalone gateway: `thunder-mw serve` runs this app under uvicorn."""

    def __init__(self, config: ThunderConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = _Core(compose(config, None, clock))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.core.http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await _lifespan(self.core, receive, send)


class ThunderMiddleware:
    """Gateway mode: mounts agent-context parsing and scheduling on any ASGI app.

    The wrapped app forwards by itself, to `call_state(scope).backend_url` (the engine the
    scheduler chose; `.context` is the agent context); it may call
    `thunder_mw.middleware.call_state.report_usage(scope, ...)` so tokens are accounted.
    """

    def __init__(self, app: ASGIApp, config: ThunderConfig) -> None:
        self.app = app
        self.core = _Core(compose(config, app, time.monotonic))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.core.http(scope, receive, send)
            return
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def receive_and_manage() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.core.startup()
            elif message["type"] == "lifespan.shutdown":
                await self.core.shutdown()
            return message

        await self.app(scope, receive_and_manage, send)


async def _lifespan(core: _Core, receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await core.startup()
            except Exception as exc:
                log.exception("startup failed")
                await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await core.shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


def create_app(config: ThunderConfig) -> ThunderGateway:
    return ThunderGateway(config)
