"""Wires the gateway's observability components together: decision log, scheduler metrics,
profiles and the dashboard, over the scheduler core they watch.

Their HTTP routes belong to the admin API (middleware/_admin.py), and the layer that times a
call as it is handed to the engine is middleware/_call_timing.py: this package answers no
request itself. The app registers `on_action` and `on_tick` with the live scheduler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from thunder_mw.engines.pool import BackendPool
from thunder_mw.observability._dashboard import Dashboard
from thunder_mw.observability._scheduler_metrics import SchedulerMetrics
from thunder_mw.observability.decisions import DecisionLog
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.observability.profiles import ProfileStore
from thunder_mw.policies.core import Action, SchedulerCore
from thunder_mw.schemas.config import ObservabilitySettings

__all__ = ["Observability"]


class Observability:
    def __init__(
        self,
        settings: ObservabilitySettings,
        core: SchedulerCore,
        pool: BackendPool,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.decisions = DecisionLog(
            metrics.registry, metrics.programs_released, log_decisions=settings.decision_log
        )
        self.scheduler_metrics = SchedulerMetrics(metrics.registry, core)
        self.profiles = (
            ProfileStore(settings.profiles, clock) if settings.profiles.enabled else None
        )
        self.dashboard = Dashboard(
            core,
            self.decisions,
            lambda: {b.label: b.describe() for b in pool.backends},
            clock,
            settings.dashboard_history_s,
        )

    def on_action(self, action: Action) -> None:
        """Each action the scheduler carried out: logged and counted, and ends profiles."""
        self.decisions.on_action(action)
        if self.profiles is not None:
            self.profiles.on_action(action)

    def on_tick(self) -> None:
        """The scheduler's tick: released profiles past their retention go."""
        if self.profiles is not None:
            self.profiles.expire()

    async def start(self) -> None:
        if self.profiles is not None:
            self.profiles.start()
        await self.dashboard.start()

    async def stop(self) -> None:
        await self.dashboard.stop()
        export = self.profiles.stop() if self.profiles is not None else None
        if export is not None:
            await asyncio.to_thread(export.close)
