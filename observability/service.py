"""Wires the gateway's observability together: decision log, scheduler metrics, profiles,
dashboard, and the one thin layer that timestamps a call as it is handed to the engine.

Their routes (/profiles, /dashboard) are the admin API's (middleware/admin.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from thunder_mw.engines.pool import BackendPool
from thunder_mw.middleware.live_scheduler import LiveScheduler
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send
from thunder_mw.observability.dashboard import Dashboard
from thunder_mw.observability.decisions import DecisionLog
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.observability.profiles import ProfileStore, Timing
from thunder_mw.observability.scheduler_metrics import SchedulerMetrics
from thunder_mw.schemas.config import ObservabilitySettings


class Observability:
    def __init__(
        self,
        settings: ObservabilitySettings,
        scheduler: LiveScheduler,
        pool: BackendPool,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.decisions = DecisionLog(
            metrics.registry, metrics.programs_released, log_decisions=settings.decision_log
        )
        self.scheduler_metrics = SchedulerMetrics(metrics.registry, scheduler.core)
        self.profiles = (
            ProfileStore(settings.profiles, clock) if settings.profiles.enabled else None
        )
        self.dashboard = Dashboard(
            scheduler.core,
            self.decisions,
            lambda: {b.label: b.describe() for b in pool.backends},
            clock,
            settings.dashboard_history_s,
        )
        scheduler.listeners.append(self.decisions.on_action)
        if self.profiles is not None:
            scheduler.listeners.append(self.profiles.on_action)
            scheduler.tick_listeners.append(self.profiles.expire)

    async def start(self) -> None:
        if self.profiles is not None:
            self.profiles.start()
        await self.dashboard.start()

    async def stop(self) -> None:
        await self.dashboard.stop()
        export = self.profiles.stop() if self.profiles is not None else None
        if export is not None:
            await asyncio.to_thread(export.close)

    def handing_to_engine(self, app: ASGIApp) -> ASGIApp:
        """Wraps the innermost app (forwarder or the user's app), inside the scheduler."""
        return _HandedToEngine(app, self)


class _HandedToEngine:
    """Stamps when a scheduled call reaches the engine client; records its profile and the
    gateway's overhead when it ends. App.http's send wrapper stamps the first body chunk."""

    def __init__(self, app: ASGIApp, owner: Observability) -> None:
        self.app = app
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: dict[str, Any] = scope.get("state") or {}
        forwarded = time.perf_counter()
        held = state.get("thunder_held_s", 0.0)
        arrived = state.get("thunder_arrived_at", forwarded)
        metrics = self.owner.scheduler_metrics
        metrics.proxy_overhead.observe(max(0.0, forwarded - arrived - held))
        if "thunder_held_s" in state:
            metrics.queue_wait.observe(held)
        ctx = state.get("agent_context")
        profiles = self.owner.profiles
        if ctx is None or profiles is None:
            await self.app(scope, receive, send)
            return
        profiles.opened(ctx)
        try:
            await self.app(scope, receive, send)
        finally:
            body = state.get("thunder_body")
            stream = bool(body is not None and body.data.get("stream"))
            profiles.record(
                ctx,
                Timing(
                    started_at=time.time() - (time.perf_counter() - arrived),
                    arrived_at=arrived,
                    queue_s=held,
                    forwarded_at=forwarded,
                    first_body_at=state.get("thunder_first_body_at"),
                    ended_at=time.perf_counter(),
                    status=state.get("thunder_status", 0),
                    stream=stream,
                ),
                state.get("thunder_backend"),
                state.get("thunder_usage"),
            )
