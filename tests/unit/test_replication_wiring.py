"""Specification of a replica as the composition root wires it (middleware/_compose.py): its
settings read once from the configuration, and a `Replication` passed to the live scheduler
that reaches the scheduler only through the `carry_out` it is given. Two replicas share one
in-process `MemoryState`, as two gateways share one Redis (tests/real/test_replicas.py runs
the same against a real redis-server behind nginx)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from support.polling import wait_until_async

from thunder_mw.engines.pool import BackendPool
from thunder_mw.middleware.call_state import CallState, RequestBody
from thunder_mw.middleware.live_scheduler import LiveScheduler
from thunder_mw.middleware.replication import ReplicaSettings, Replication
from thunder_mw.policies.core import Action, Released, SchedulerCore
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention, ServerSettings, StateSettings, ThunderConfig
from thunder_mw.state.store import MemoryState, MemoryStore

CAPACITY = 1_000
PIPELINE: list[dict[str, Any]] = [
    {"admission": {"high_watermark": 1.0, "overflow": "hold", "buffer_tokens_per_program": 0}},
    {"gc_hooks": {}},
]


def test_a_replica_reads_the_admission_watermark_by_the_stage_type_and_fail_closed() -> None:
    admission = {"high_watermark": 0.85, "low_watermark": 0.8}
    stages = build_pipeline([{"admission": admission}, {"gc_hooks": {}}])
    settings = ReplicaSettings.of(StateSettings(on_unavailable="fail_closed"), stages)
    assert settings == ReplicaSettings(fail_closed=True, high_watermark=0.85)


def test_without_an_admission_stage_the_shared_gate_has_no_limit() -> None:
    settings = ReplicaSettings.of(StateSettings(), build_pipeline([{"round_robin": {}}]))
    assert settings == ReplicaSettings(fail_closed=False, high_watermark=None)


class Replica:
    """One gateway's scheduler and replication over the shared state, built as _compose.py
    builds them (the store in memory instead of Redis)."""

    def __init__(self, name: str, state: MemoryState) -> None:
        config = ThunderConfig(
            backends=[{"name": "e", "url": "http://127.0.0.1:9", "capacity_tokens": CAPACITY}],
            policies=PIPELINE,
        )
        pool = BackendPool(config.backends, config.server)
        core = SchedulerCore(pool.configured(), build_pipeline(config.policies))
        self.heard: list[Action] = []

        def carry_out(actions: list[Action]) -> None:
            self.scheduler.carry_out(actions)

        self.replication = Replication(
            core,
            MemoryStore(name, state),
            ReplicaSettings.of(config.state, core.pipeline()),
            clock=asyncio.get_running_loop().time,
            tick_interval_s=ServerSettings().tick_interval_s,
            carry_out=carry_out,
        )
        self.scheduler = LiveScheduler(
            pool,
            core,
            asyncio.get_running_loop().time,
            listeners=(self.heard.append,),
            replication=self.replication,
        )


@contextlib.asynccontextmanager
async def two_replicas() -> AsyncIterator[tuple[Replica, Replica]]:
    """Replicas a and b over one shared state, started, and stopped after the block."""
    state = MemoryState()
    a, b = Replica("a", state), Replica("b", state)
    await a.scheduler.start()
    await b.scheduler.start()
    try:
        yield a, b
    finally:
        await b.scheduler.stop()
        await a.scheduler.stop()


def call(program_id: str, tokens: int) -> CallState:
    state = CallState()
    state.context = AgentContext(program_id=program_id, source=Convention.THUNDERAGENT)
    data = {"messages": [{"role": "user", "content": "w" * (tokens * 4)}], "max_tokens": 1}
    state.body = RequestBody(data, json.dumps(data).encode())
    return state


async def until(done: Callable[[], bool]) -> None:
    async def asked() -> bool:
        return done()

    await wait_until_async(asked, 5.0, interval_s=0.005)


def test_a_call_past_the_shared_limit_waits_at_the_gate_counted_as_held() -> None:
    async def main() -> None:
        async with two_replicas() as (a, b):
            assert await a.scheduler.admit(call("p1", 600)) == "e"
            # b's own core has room for p2; the shared gate, counting a's p1, has not.
            second = asyncio.ensure_future(b.scheduler.admit(call("p2", 600)))
            await until(lambda: b.scheduler.held == 1)
            assert not second.done() and b.replication.held == 1
            # a lets go of p1: its freed room is announced, and b's call goes on.
            assert a.scheduler.release("p1")
            assert await asyncio.wait_for(second, 5.0) == "e"
            assert b.scheduler.held == 0

    asyncio.run(main())


def test_a_release_announced_by_another_replica_is_carried_out_by_this_scheduler() -> None:
    async def main() -> None:
        async with two_replicas() as (a, b):
            b_call = call("p", 100)
            assert await b.scheduler.admit(b_call) == "e"
            b.scheduler.finish(b_call, "ok")
            a.scheduler.release("p")  # an operator's release, at the other replica
            await until(lambda: b.scheduler.program("p") is None)
            assert [x for x in b.heard if isinstance(x, Released)] == [Released("p", "release", ())]

    asyncio.run(main())
