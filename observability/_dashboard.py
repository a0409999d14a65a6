"""The live dashboard: one self-contained page, and the JSON snapshot it polls every second.

The page (dashboard.html, shipped with the package; no CDN, these machines have no internet)
draws engines, programs by state over time, the paused queue, the top programs by tokens
and the recent decisions from `GET /dashboard/state`. A sampler keeps the programs-by-state
history on the server, so a page opened late still shows the last minutes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from thunder_mw.observability._scheduler_metrics import hit_rate
from thunder_mw.observability.decisions import DecisionLog
from thunder_mw.policies.core import SchedulerCore
from thunder_mw.policies.program_table import Phase, ProgramState
from thunder_mw.policies.views import ProgramView
from thunder_mw.schemas.views import (
    BackendView,
    DashboardBackend,
    DashboardState,
    QueuedProgram,
    TopProgram,
)

__all__ = ["DECISION_ROWS", "QUEUE_ROWS", "TOP_ROWS", "Dashboard", "page"]

QUEUE_ROWS = 50
TOP_ROWS = 10
DECISION_ROWS = 60


def page() -> bytes:
    return Path(__file__).with_name("dashboard.html").read_bytes()


def _counts(core: SchedulerCore) -> dict[str, int]:
    """Programs reasoning, acting (ACTIVE), paused and queued (PAUSED with requests held),
    counted by the core: no program is copied for them."""
    by_state = core.state_counts()
    active = by_state[ProgramState.ACTIVE]
    return {
        "reasoning": active[Phase.REASONING],
        "acting": active[Phase.ACTING],
        "paused": sum(by_state[ProgramState.PAUSED].values()),
        "queued": core.held_count(),
    }


def _longest_queued(programs: Iterable[ProgramView]) -> list[ProgramView]:
    queued = (p for p in programs if p.queued_at is not None)
    return heapq.nsmallest(QUEUE_ROWS, queued, key=lambda p: p.queued_at or 0.0)


def _most_tokens(programs: Iterable[ProgramView]) -> list[ProgramView]:
    return heapq.nlargest(TOP_ROWS, programs, key=lambda p: p.prompt_tokens + p.completion_tokens)


class Dashboard:
    def __init__(
        self,
        core: SchedulerCore,
        decisions: DecisionLog,
        health: Callable[[], dict[str, BackendView]],
        clock: Callable[[], float],
        history_s: int,
        sample_interval_s: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = core
        self.decisions = decisions
        self.health = health  # backend label → its pool description (url, capacity source)
        self.clock = clock
        self.wall = wall_clock
        self.sample_interval_s = sample_interval_s
        self.history: collections.deque[tuple[float, int, int, int, int]] = collections.deque(
            maxlen=max(2, int(history_s / sample_interval_s))
        )
        self._task: asyncio.Task[None] | None = None
        self._page: bytes | None = None

    @property
    def html(self) -> bytes:
        if self._page is None:
            self._page = page()
        return self._page

    async def start(self) -> None:
        self.sample()
        self._task = asyncio.create_task(self._sampler(), name="thunder-mw-dashboard")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sampler(self) -> None:
        while True:
            await asyncio.sleep(self.sample_interval_s)
            self.sample()

    def sample(self) -> None:
        c = _counts(self.core)
        self.history.append(
            (round(self.wall(), 3), c["reasoning"], c["acting"], c["paused"], c["queued"])
        )

    def snapshot(self) -> DashboardState:
        core, now = self.core, self.clock()
        health = self.health()
        backends = []
        for b in core.backend_views().values():
            m = b.metrics
            described = health.get(b.label)
            backends.append(
                DashboardBackend(
                    backend=b.label,
                    url=described.url if described is not None else None,
                    healthy=b.healthy,
                    capacity_tokens=b.capacity,
                    effective_capacity_tokens=None
                    if b.capacity is None
                    else int(b.capacity * b.scale),
                    reserved_tokens=b.reserved,
                    programs=core.programs_on(b.label),
                    engine_kv_usage=m.kv_usage,
                    engine_running=m.running,
                    engine_waiting=m.waiting,
                    engine_prefix_hit_rate=hit_rate(m.prefix_hits_total, m.prefix_queries_total),
                    engine_preemptions=m.preemptions_total,
                )
            )
        # Only the rows shown are copied out of the core.
        queued = core.snapshots(_longest_queued)
        top = core.snapshots(_most_tokens)
        recent = list(self.decisions.recent)[-DECISION_ROWS:]
        recent.reverse()
        return DashboardState(
            now=self.wall(),
            backends=backends,
            counts={**_counts(core), "total": core.program_count()},
            counters=dict(core.counts()),
            history=list(self.history),
            queue=[
                QueuedProgram(
                    program_id=p.program_id,
                    waited_s=round(now - (p.queued_at or now), 3),
                    home=p.backend,
                    context_tokens=p.context_tokens,
                    pauses=p.pauses,
                    waiting=p.waiting,
                )
                for p in queued
            ],
            top=[
                TopProgram(
                    program_id=p.program_id,
                    state=p.state.value,
                    phase=p.phase.value,
                    backend=p.backend,
                    tokens=p.prompt_tokens + p.completion_tokens,
                    context_tokens=p.context_tokens,
                    steps=p.steps,
                    pauses=p.pauses,
                    migrations=p.migrations,
                )
                for p in top
            ],
            decisions=recent,
        )
