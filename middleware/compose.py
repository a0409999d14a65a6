"""The composition root: builds every live component of a gateway once, each with its
collaborators passed to its constructor, in the one order their dependencies allow.

    pool ─► core ─► metrics, tools, observability, prefiller, owners ─► scheduler
         ─► forwarder | the user's app ─► the request layers ─► fleet ─► admin routes

Nothing is wired afterwards: listeners are constructor arguments, in the order they hear an
action. The one cycle (the pool reports probes to the scheduler built over it) is closed by
a function that names the scheduler, which exists before the pool's first probe.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from thunder_mw._version import __version__
from thunder_mw.engines.pool import Backend, BackendPool
from thunder_mw.middleware.admin import (
    AdminAccess,
    AdminRoutes,
    EngineServices,
    ProgramServices,
    Telemetry,
)
from thunder_mw.middleware.agent_context import AgentContextMiddleware
from thunder_mw.middleware.backend_url import WithBackendUrl
from thunder_mw.middleware.call_timing import CallTiming
from thunder_mw.middleware.fleet import Fleet
from thunder_mw.middleware.forwarder import Forwarder
from thunder_mw.middleware.live_scheduler import HoldLimits, LiveScheduler
from thunder_mw.middleware.program_ownership import ProgramOwnership
from thunder_mw.middleware.rollout_routes import RolloutRoutes
from thunder_mw.middleware.scheduling import SchedulingMiddleware
from thunder_mw.middleware.speculative_prefill import SpeculativePrefiller
from thunder_mw.middleware.types import ASGIApp
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.observability.prefill_metrics import PrefillMetrics
from thunder_mw.observability.service import Observability
from thunder_mw.policies.core import Action, BackendMetrics, SchedulerCore
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.state.store import MemoryStore, SchedulerStore
from thunder_mw.tools.docker_tools import DockerTools


@dataclass(frozen=True, eq=False)
class Components:
    """One gateway's live components, as `compose` built them."""

    config: ThunderConfig
    pool: BackendPool
    scheduler: LiveScheduler
    metrics: GatewayMetrics
    tools: DockerTools | None
    observability: Observability
    prefiller: SpeculativePrefiller | None
    owners: ProgramOwnership | None
    forwarder: Forwarder
    context_layer: AgentContextMiddleware
    fleet: Fleet
    admin: AdminRoutes


def compose(
    config: ThunderConfig,
    app: ASGIApp | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Components:
    """The standalone gateway's components (`app` None: the Forwarder sends calls to the
    engines), or gateway mode's around the user's `app`, which forwards by itself."""

    def probed(backend: Backend, metrics: BackendMetrics | None) -> None:
        scheduler.on_probe(backend, metrics)

    pool = BackendPool(config.backends, config.server, listeners=(probed,))
    core = SchedulerCore(pool.configured(), build_pipeline(config.policies))
    metrics = GatewayMetrics()
    metrics.watch(core.programs, pool)
    tools = _docker_tools(config, core, metrics, clock)
    observability = Observability(config.observability, core, pool, metrics, clock)
    prefiller = SpeculativePrefiller.for_core(
        core, pool, config.speculative_prefill, PrefillMetrics(metrics.registry)
    )
    owners = (
        ProgramOwnership(config.agent_context.program_owner_header)
        if config.agent_context.program_owner == "header"
        else None
    )
    listeners = [
        *(() if tools is None else (tools.on_action,)),
        observability.on_action,
        *(() if prefiller is None else (prefiller.on_action,)),
        *(() if owners is None else (owners.on_action,)),
    ]
    scheduler = build_scheduler(
        config, pool, core, clock, listeners, (observability.on_tick,), owners
    )
    # Standalone only: in gateway mode the answers pass through the user's app.
    forwarder = Forwarder(pool, config.server, prefiller if app is None else None)
    innermost: ASGIApp = forwarder if app is None else WithBackendUrl(app, pool)
    context_layer = AgentContextMiddleware(
        SchedulingMiddleware(CallTiming(innermost, observability), scheduler, tools, owners),
        config.agent_context,
        config.server.max_body_bytes,
        encode_eagerly=app is not None,
        on_missing_context=metrics.without_context.inc,
    )
    fleet = Fleet(pool, scheduler)
    token = config.server.admin_token
    admin = AdminRoutes(
        ProgramServices(scheduler, context_layer.parser, tools, clock),
        EngineServices(pool, RolloutRoutes(fleet, pool)),
        Telemetry(metrics, observability, __version__),
        AdminAccess(token.get_secret_value() if token else None, owners),
    )
    return Components(
        config,
        pool,
        scheduler,
        metrics,
        tools,
        observability,
        prefiller,
        owners,
        forwarder,
        context_layer,
        fleet,
        admin,
    )


def build_scheduler(
    config: ThunderConfig,
    pool: BackendPool,
    core: SchedulerCore,
    clock: Callable[[], float],
    listeners: Sequence[Callable[[Action], None]],
    tick_listeners: Sequence[Callable[[], None]],
    owners: ProgramOwnership | None,
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
        core,
        clock,
        server.tick_interval_s,
        HoldLimits.of(server),
        listeners=listeners,
        tick_listeners=tick_listeners,
        store=store,
        on_unavailable=config.state.on_unavailable,
        # With replicas, the owners' bindings are shared through the program records.
        ownership=owners,
    )


def _docker_tools(
    config: ThunderConfig,
    core: SchedulerCore,
    metrics: GatewayMetrics,
    clock: Callable[[], float],
) -> DockerTools | None:
    settings = config.tools.docker
    if settings.enabled is False:
        return None
    tools = DockerTools(
        settings,
        lambda program_id: core.program(program_id) is not None,
        clock,
        on_reclaimed=lambda reason: metrics.containers_reclaimed.labels(reason).inc(),
        on_failure=metrics.reclaim_failures.inc,
    )
    metrics.watch_tools(tools)
    return tools
