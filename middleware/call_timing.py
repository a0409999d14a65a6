"""The thin layer, just inside the scheduler, that times each call handed to the engine:
the gateway's own overhead and queue wait as metrics, and the call's step in its program's
profile."""

from __future__ import annotations

import time
from typing import Any

from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send
from thunder_mw.observability.profiles import Timing
from thunder_mw.observability.service import Observability


class CallTiming:
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
