"""Assembles the layers: the standalone gateway app, and ThunderMiddleware for gateway mode.

Standalone:  admin routes | AgentContextMiddleware → SchedulingMiddleware → Forwarder
Gateway:     admin routes | AgentContextMiddleware → SchedulingMiddleware → the user's app
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from thunder_mw import __version__
from thunder_mw.engines.pool import BackendPool
from thunder_mw.middleware.admin import AdminRoutes, is_admin_path
from thunder_mw.middleware.agent_context import AgentContextMiddleware
from thunder_mw.middleware.call_state import STATE_KEY, CallState
from thunder_mw.middleware.call_timing import CallTiming
from thunder_mw.middleware.errors import send_error
from thunder_mw.middleware.fleet import Fleet
from thunder_mw.middleware.forwarder import Forwarder
from thunder_mw.middleware.live_scheduler import HoldLimits, LiveScheduler
from thunder_mw.middleware.program_ownership import ProgramOwnership
from thunder_mw.middleware.rollout_routes import RolloutRoutes
from thunder_mw.middleware.scheduling import SchedulingMiddleware
from thunder_mw.middleware.speculative_prefill import SpeculativePrefiller
from thunder_mw.middleware.types import ASGIApp, Message, Receive, Scope, Send
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.observability.prefill_metrics import PrefillMetrics
from thunder_mw.observability.service import Observability
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.state.store import MemoryStore, SchedulerStore
from thunder_mw.tools.docker_tools import DockerTools

log = logging.getLogger("thunder_mw")


def _scheduler(
    config: ThunderConfig, pool: BackendPool, clock: Callable[[], float]
) -> LiveScheduler:
    """This process's scheduler; with `state.backend: redis`, one replica of several."""
    server = config.server
    store: SchedulerStore = MemoryStore()
    if config.state.backend == "redis":
        from thunder_mw.state.redis_store import RedisStore

        replica_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        store = RedisStore(config.state, replica_id)
    return LiveScheduler(
        pool,
        config.policies,
        clock,
        server.tick_interval_s,
        HoldLimits.of(server),
        store=store,
        on_unavailable=config.state.on_unavailable,
    )


class _Core:
    """What both modes share: backends, scheduler, metrics, admin routes, the two layers."""

    def __init__(
        self,
        config: ThunderConfig,
        inner: ASGIApp | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.pool = BackendPool(config.backends, config.server)
        self.scheduler = _scheduler(config, self.pool, clock)
        self.metrics = GatewayMetrics()
        self.metrics.watch(self.scheduler.programs, self.pool)
        self.forwarder = Forwarder(self.pool, config.server)
        self.tools = _docker_tools(config, self.scheduler, self.metrics, clock)
        self.observability = Observability(
            config.observability, self.scheduler.core, self.pool, self.metrics, clock
        )
        self.scheduler.listeners.append(self.observability.on_action)
        self.prefiller = SpeculativePrefiller.for_core(
            self.scheduler.core,
            self.pool,
            config.speculative_prefill,
            PrefillMetrics(self.metrics.registry),
        )
        if self.prefiller is not None:
            # Standalone only: in gateway mode the answers pass through the user's app.
            self.forwarder.prefill = self.prefiller if inner is None else None
            self.scheduler.listeners.append(self.prefiller.on_action)
        self.scheduler.tick_listeners.append(self.observability.on_tick)
        self.owners = _program_ownership(config, self.scheduler)
        self.max_header_bytes = config.server.max_header_bytes
        self.max_headers = config.server.max_headers
        standalone = inner is None
        innermost: ASGIApp = self.forwarder if inner is None else inner
        self.context_layer = AgentContextMiddleware(
            SchedulingMiddleware(
                CallTiming(innermost, self.observability),
                self.scheduler,
                self.tools,
                self.owners,
            ),
            config.agent_context,
            config.server.max_body_bytes,
            encode_eagerly=not standalone,
            on_missing_context=self.metrics.without_context.inc,
        )
        self.pipeline: ASGIApp = self.context_layer
        self.fleet = Fleet(self.pool, self.scheduler)
        self.admin = AdminRoutes(
            self.scheduler,
            self.pool,
            self.metrics,
            self.context_layer.parser,
            config.server.admin_token.get_secret_value() if config.server.admin_token else None,
            clock,
            __version__,
            self.tools,
            observability=self.observability,
            owners=self.owners,
            rollout=RolloutRoutes(self.fleet, self.pool),
        )

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


def _program_ownership(config: ThunderConfig, scheduler: LiveScheduler) -> ProgramOwnership | None:
    settings = config.agent_context
    if settings.program_owner != "header":
        return None
    owners = ProgramOwnership(settings.program_owner_header)
    scheduler.listeners.append(owners.on_action)
    scheduler.ownership = owners  # with replicas, bindings go in the shared records
    return owners


def _docker_tools(
    config: ThunderConfig,
    scheduler: LiveScheduler,
    metrics: GatewayMetrics,
    clock: Callable[[], float],
) -> DockerTools | None:
    settings = config.tools.docker
    if settings.enabled is False:
        return None
    tools = DockerTools(
        settings,
        lambda program_id: scheduler.program(program_id) is not None,
        clock,
        on_reclaimed=lambda reason: metrics.containers_reclaimed.labels(reason).inc(),
        on_failure=metrics.reclaim_failures.inc,
    )
    scheduler.listeners.append(tools.on_action)
    metrics.watch_tools(tools)
    return tools


class ThunderGateway:
    """The standalone gateway: `thunder-mw serve` runs this app under uvicorn."""

    def __init__(self, config: ThunderConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = _Core(config, None, clock)

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
        self.core = _Core(config, _WithBackendUrl(app, self), time.monotonic)

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


class _WithBackendUrl:
    def __init__(self, app: ASGIApp, owner: ThunderMiddleware) -> None:
        self.app = app
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state")
        call: CallState | None = state.get(STATE_KEY) if state is not None else None
        if call is not None and call.backend is not None:
            backend = self.owner.core.pool.get(call.backend)
            call.backend_url = backend.url if backend else None
        await self.app(scope, receive, send)


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
