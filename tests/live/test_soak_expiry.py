"""Programs that are never released expire, and nothing of them stays behind in the gateway.

A few hundred programs, in waves over several idle-expiry periods, run through the real
gateway (in-process, over ASGI) in front of two fake engines; none calls /programs/release.
The gateway's clock is injected and its timers are driven by the test, so expiry is exact
and nothing waits on wall time. After the last expiry (and the profiles' retention) every
table and index the scheduler, profiles, decision log and metrics keep is checked for them.
The timed, 10,000-program version is benchmarks/soak.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.asgi_servers import serving
from support.fake_engine import FakeEngine

from thunder_mw.middleware.app import ThunderGateway
from thunder_mw.policies import CallFinished, RequestArrived, Tick
from thunder_mw.policies.core import Released, RequestInfo, SchedulerCore
from thunder_mw.policies.estimates import MAX_SESSION_TYPES
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import DockerToolSettings, ThunderConfig
from thunder_mw.sim.ports import free_port
from thunder_mw.tools.docker_tools import DockerTools

TTL_S = 60.0
RETENTION_S = 30.0
WAVES = 6
PER_WAVE = 50
PROGRAMS = WAVES * PER_WAVE
CONCURRENCY = 16
DECISIONS_KEPT = 200  # DecisionLog's default ring


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Observed:
    """What the gateway held while programs were live, and once they had all expired."""

    live_programs_peak: int = 0
    profiles_peak: int = 0
    owners_peak: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    expired: dict[str, Any] = field(default_factory=dict)
    metrics_text: str = ""
    profiles_count: int = -1


def _program_id(i: int) -> str:
    return f"soak-{i:04d}"


def _config(urls: list[str]) -> ThunderConfig:
    return ThunderConfig(
        # The test drives the timers itself: the gateway's own would use wall time.
        server={"tick_interval_s": 3600, "probe_interval_s": 3600, "log_level": "warning"},
        backends=[
            {"name": f"e{i}", "url": url, "capacity_tokens": 10_000_000}
            for i, url in enumerate(urls)
        ],
        policies=[
            {"admission": {"overflow": "hold"}},
            {"state_aware_pause": {}},
            {"migration": {}},
            {"gc_hooks": {"idle_ttl_s": TTL_S}},
        ],
        observability={"profiles": {"retention_s": RETENTION_S}, "decision_log": False},
        tools={"docker": {"enabled": False}},
        # Every program is bound to its client's key: the bindings must expire with it.
        agent_context={"program_owner": "header"},
    )


def _internals(gateway: ThunderGateway) -> dict[str, Any]:
    """Every structure that could keep a program, and the programs (or ids) it keeps."""
    core = gateway.core
    sched = core.scheduler.core
    profiles = core.observability.profiles
    assert profiles is not None
    heaps = {"idle": sched.idle, "queue": sched.queue}
    for label, backend in sched.backends.items():
        heaps[f"{label}.acting"] = backend.acting
        heaps[f"{label}.reasoning"] = backend.reasoning
    return {
        "table": len(sched.table),
        "per_backend": {label: sched.table.programs_on(label) for label in sched.backends},
        "reserved": {label: b.reserved for label, b in sched.backends.items()},
        "pending_release": {label: b.pending_release for label, b in sched.backends.items()},
        # Lazy heaps keep stale entries: count every entry, stale or not.
        "heap_entries": {name: len(heap) for name, heap in heaps.items()},
        "queue_fifo": len(sched.queue_fifo),
        "queued": sched.queued,
        "waiters": len(core.scheduler._waiters),
        "held": core.scheduler.held,
        "profiles": len(profiles),
        "profiles_released": len(profiles._released),
        "decisions": len(core.observability.decisions.recent),
        "owner_bindings": len(core.owners.owners) if core.owners is not None else -1,
    }


async def _tick(gateway: ThunderGateway) -> None:
    scheduler = gateway.core.scheduler
    scheduler._apply(scheduler.core.handle(Tick(scheduler.clock())).actions)


async def _program(client: httpx.AsyncClient, i: int, statuses: dict[int, int]) -> None:
    for call in range(1 + i % 3):  # one to three calls, plain and streamed, then silence
        body = {
            "model": "fake-model",
            "messages": [{"role": "user", "content": f"task {i}, step {call}"}],
            "max_tokens": 4,
            "stream": call % 2 == 1,
            "program_id": _program_id(i),
        }
        r = await client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer key-{i % 7}"}
        )
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1


async def _soak(urls: list[str]) -> Observed:
    clock = Clock()
    gateway = ThunderGateway(_config(urls), clock)
    seen = Observed()
    transport = httpx.ASGITransport(app=gateway)
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        async with limit:
            await _program(client, i, seen.statuses)

    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30) as client:
        try:
            for wave in range(WAVES):
                await asyncio.gather(
                    *(one(client, i) for i in range(wave * PER_WAVE, (wave + 1) * PER_WAVE))
                )
                inside = _internals(gateway)
                seen.live_programs_peak = max(seen.live_programs_peak, inside["table"])
                seen.profiles_peak = max(seen.profiles_peak, inside["profiles"])
                seen.owners_peak = max(seen.owners_peak, inside["owner_bindings"])
                # Half an expiry period between waves: programs expire while others run.
                clock.now += TTL_S / 2
                await _tick(gateway)
            clock.now += TTL_S + 1
            await _tick(gateway)
            clock.now += RETENTION_S + 1
            await _tick(gateway)
            profiles = (await client.get("/profiles")).json()
            seen.profiles_count = profiles["count"]
            seen.expired = _internals(gateway)
            seen.metrics_text = (await client.get("/metrics")).text
        finally:
            await gateway.core.shutdown()
    return seen


@pytest.fixture(scope="module")
def soaked() -> Observed:
    engines = [FakeEngine(chunks=2), FakeEngine(chunks=2)]
    with serving(engines[0]) as a, serving(engines[1]) as b:
        return asyncio.run(_soak([a.url, b.url]))


def test_every_call_of_the_never_released_programs_was_answered(soaked: Observed) -> None:
    calls = sum(1 + i % 3 for i in range(PROGRAMS))
    assert soaked.statuses == {200: calls}


def test_programs_stay_live_between_waves_until_their_idle_ttl(soaked: Observed) -> None:
    # Half a TTL between waves: the last two waves are live at once, never all of them.
    assert 2 * PER_WAVE <= soaked.live_programs_peak < PROGRAMS
    assert soaked.profiles_peak >= 2 * PER_WAVE


def test_expired_programs_leave_the_program_table(soaked: Observed) -> None:
    assert soaked.expired["table"] == 0
    assert set(soaked.expired["per_backend"].values()) == {0}


def test_expired_programs_hand_back_every_reserved_token(soaked: Observed) -> None:
    assert set(soaked.expired["reserved"].values()) == {0}
    assert set(soaked.expired["pending_release"].values()) == {0}


def test_expired_programs_leave_no_entry_in_any_scheduler_index(soaked: Observed) -> None:
    assert soaked.expired["heap_entries"] == dict.fromkeys(soaked.expired["heap_entries"], 0)
    assert soaked.expired["queue_fifo"] == 0
    assert soaked.expired["queued"] == 0


def test_expired_programs_release_their_owner_bindings(soaked: Observed) -> None:
    assert soaked.owners_peak >= 2 * PER_WAVE  # bound while live
    assert soaked.expired["owner_bindings"] == 0


def test_no_request_stays_held_for_an_expired_program(soaked: Observed) -> None:
    assert soaked.expired["waiters"] == 0
    assert soaked.expired["held"] == 0


def test_expired_programs_profiles_go_after_their_retention(soaked: Observed) -> None:
    assert soaked.profiles_count == 0
    assert soaked.expired["profiles"] == 0
    assert soaked.expired["profiles_released"] == 0


def test_the_decision_log_keeps_a_bounded_ring_not_every_program(soaked: Observed) -> None:
    # Each program was admitted and released: 2 decisions each, far more than are kept.
    assert soaked.expired["decisions"] == DECISIONS_KEPT


def test_metrics_count_the_expiries_and_label_no_series_by_program(soaked: Observed) -> None:
    text = soaked.metrics_text
    assert f'thunder_mw_programs_released_total{{reason="expired"}} {float(PROGRAMS)}' in text
    assert "soak-" not in text
    live = [line for line in text.splitlines() if line.startswith("thunder_mw_programs{")]
    assert live == []


def test_a_program_whose_containers_were_never_adopted_leaves_nothing_in_the_tool_manager(
    tmp_path: Path,
) -> None:
    """The Docker engine is down, so adoption is deferred; the program then expires."""

    async def scenario() -> tuple[int, dict[str, set[str]]]:
        tools = DockerTools(
            DockerToolSettings(
                enabled=True,  # manage even though the engine is down (it is retried)
                engine_url=f"tcp://127.0.0.1:{free_port()}",  # nothing listens there
                journal_path=str(tmp_path / "journal.sqlite3"),
                call_timeout_s=5,
            ),
            is_live=lambda program_id: False,
        )
        await tools.start()
        try:
            ctx = AgentContext(program_id="soak-tools", source=None, docker_ids=("sandbox-1",))
            await tools.adopt(ctx)
            tools.on_action(Released("soak-tools", "expired", ("sandbox-1",)))
            await asyncio.sleep(0)  # the reclaim is scheduled with call_soon
            return tools.adoptions_deferred, dict(tools._refs)
        finally:
            await tools.stop()

    deferred, refs = asyncio.run(scenario())
    assert deferred == 1
    assert refs == {}


def test_a_new_session_type_per_program_does_not_grow_the_tool_time_model_without_bound() -> None:
    core = SchedulerCore([("e", 10_000_000)], build_pipeline(None))
    for i in range(MAX_SESSION_TYPES + 200):
        ctx = AgentContext(program_id=f"p{i}", source=None, session_type=f"type-{i}")
        now = float(i)
        core.handle(RequestArrived(ctx, RequestInfo(prompt_chars=100), now))
        core.handle(CallFinished(ctx.program_id, Usage(25, 4), True, now))
        # learns its tool gap
        core.handle(RequestArrived(ctx, RequestInfo(prompt_chars=120), now + 0.5))
    assert len(core.tool_time._by_type) == MAX_SESSION_TYPES
