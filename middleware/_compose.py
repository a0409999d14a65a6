"""The composition root: builds every live component of a gateway once, each with its
collaborators and its settings passed to its constructor, in the one order their
dependencies allow.

    pool ─► core ─► tools ─► metrics ─► observability, prefiller, owners
         ─► [store ─► replication] ─► scheduler
         ─► forwarder | the user's app ─► the request layers ─► fleet ─► admin routes

Nothing is wired afterwards: listeners are constructor arguments, in the order they hear an
action. Three edges point back to a component built later, each closed by a function that
names it and runs only once the gateway has started: the pool reports probes to the
scheduler, the tools count reclaims on the metrics (which read the tools' gauges), and a
replica hands the core's answers to the other replicas' news to the scheduler it serves.
The one registration after construction is prometheus_client's own: each component built
on the metrics' registry (observability, speculative prefill) registers its series there.
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
from thunder_mw.middleware._admin import (
    AdminAccess,
    AdminRoutes,
    EngineServices,
    ProgramServices,
    Telemetry,
)
from thunder_mw.middleware._backend_url import WithBackendUrl
from thunder_mw.middleware._call_timing import CallTiming
from thunder_mw.middleware._fleet import Fleet
from thunder_mw.middleware._rollout_routes import RolloutRoutes
from thunder_mw.middleware.agent_context import AgentContextMiddleware
from thunder_mw.middleware.forwarder import Forwarder
from thunder_mw.middleware.live_scheduler import HoldLimits, LiveScheduler
from thunder_mw.middleware.program_ownership import ProgramOwnership
from thunder_mw.middleware.replication import ReplicaSettings, Replication
from thunder_mw.middleware.scheduling import SchedulingMiddleware
from thunder_mw.middleware.speculative_prefill import SpeculativePrefiller
from thunder_mw.middleware.types import ASGIApp
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.observability.prefill_metrics import PrefillMetrics
from thunder_mw.observability.service import Observability
from thunder_mw.policies.core import Action, BackendMetrics, SchedulerCore
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.stages import GcHooks
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.tools.docker_tools import DockerTools

__all__ = ["Components", "build_scheduler", "compose"]


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
    # Reclaims are counted on the metrics built next, which read the tools' gauges.
    tools = _docker_tools(
        config,
        core,
        clock,
        on_reclaimed=lambda reason: metrics.containers_reclaimed.labels(reason).inc(),
        on_failure=lambda: metrics.reclaim_failures.inc(),
    )
    metrics = GatewayMetrics(core.state_counts, pool, tools)
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
    """This process's scheduler; with `state.backend: redis`, one replica of several,
    given the `Replication` built here over the shared store."""
    server = config.server

    def carry_out(actions: list[Action]) -> None:
        # The replica's background work starts with the scheduler, built just below.
        scheduler.carry_out(actions)

    replication = None
    if config.state.backend == "redis":
        replication = _replication(config, core, clock, carry_out, owners)
    scheduler = LiveScheduler(
        pool,
        core,
        clock,
        server.tick_interval_s,
        HoldLimits.of(server),
        listeners=listeners,
        tick_listeners=tick_listeners,
        replication=replication,
    )
    return scheduler


def _replication(
    config: ThunderConfig,
    core: SchedulerCore,
    clock: Callable[[], float],
    carry_out: Callable[[list[Action]], None],
    owners: ProgramOwnership | None,
) -> Replication:
    """One replica's share of the fleet, over the Redis store (imported only here: a single
    gateway needs no redis client)."""
    from thunder_mw.state.redis_store import RedisStore

    stages = core.pipeline()
    # A program's record outlives its last change as long as the pipeline keeps an idle
    # program (gc_hooks' idle expiry), else half an hour.
    record_ttl_ms = 1_800_000
    for stage in stages:
        if isinstance(stage, GcHooks):
            record_ttl_ms = int(stage.params.idle_ttl_s * 1000)
    replica_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    return Replication(
        core,
        RedisStore(config.state, replica_id, record_ttl_ms),
        ReplicaSettings.of(config.state, stages),
        clock=clock,
        tick_interval_s=config.server.tick_interval_s,
        carry_out=carry_out,
        # The owners' bindings are shared through the program records.
        ownership=owners,
    )


def _docker_tools(
    config: ThunderConfig,
    core: SchedulerCore,
    clock: Callable[[], float],
    on_reclaimed: Callable[[str], None],
    on_failure: Callable[[], None],
) -> DockerTools | None:
    settings = config.tools.docker
    if settings.enabled is False:
        return None
    return DockerTools(
        settings,
        core.knows,
        clock,
        on_reclaimed=on_reclaimed,
        on_failure=on_failure,
    )
