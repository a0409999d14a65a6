"""The thin layer, just inside the scheduler, that times each call handed to the engine:
the gateway's own overhead and queue wait as metrics, and the call's step in its program's
profile."""

from __future__ import annotations

import time

from thunder_mw.middleware.call_state import STATE_KEY, CallState
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send
from thunder_mw.observability.profiles import Timing
from thunder_mw.observability.service import Observability

__all__ = ["CallTiming"]


class CallTiming:
    """Stamps when a scheduled call reaches the engine client; records its profile and the
    gateway's overhead when it ends. App.http's send wrapper stamps the first body chunk."""

    def __init__(self, app: ASGIApp, owner: Observability) -> None:
        self.app = app
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state")
        call: CallState | None = state.get(STATE_KEY) if state is not None else None
        if call is None:
            await self.app(scope, receive, send)
            return
        forwarded = call.forwarded_at = time.perf_counter()
        held = call.held_s or 0.0
        arrived = call.arrived_at
        metrics = self.owner.scheduler_metrics
        metrics.proxy_overhead.observe(max(0.0, forwarded - arrived - held))
        if call.held_s is not None:
            metrics.queue_wait.observe(held)
        ctx = call.context
        profiles = self.owner.profiles
        if ctx is None or profiles is None:
            await self.app(scope, receive, send)
            return
        profiles.opened(ctx)
        try:
            await self.app(scope, receive, send)
        finally:
            profiles.record(
                ctx,
                Timing(
                    started_at=time.time() - (time.perf_counter() - arrived),
                    arrived_at=arrived,
                    queue_s=held,
                    forwarded_at=forwarded,
                    first_body_at=call.first_body_at,
                    ended_at=time.perf_counter(),
                    status=call.status,
                    stream=call.stream,
                ),
                call.backend,
                call.usage,
            )
