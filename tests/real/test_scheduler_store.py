"""The contract every scheduler store keeps (state/store.py): the memory store and the Redis
store (state/redis_store.py, on a real redis-server) pass the same tests."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable, Iterator

import pytest
from support.polling import wait_until_async

from thunder_mw.lab.replica_stack import RedisServer, missing_binaries
from thunder_mw.schemas.config import StateSettings
from thunder_mw.state.store import (
    MemoryState,
    MemoryStore,
    ProgramRecord,
    SchedulerStore,
    SyncItem,
)

ENGINES = ["e0", "e1"]
_prefixes = itertools.count()
Fleet = Callable[[str], SchedulerStore]  # a replica id -> that replica's store


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    missing = missing_binaries()
    if missing:
        if os.environ.get("THUNDER_MW_REQUIRE_REAL") == "1":
            pytest.fail(f"{missing} missing (scripts/setup_redis_nginx.sh)")
        pytest.skip(f"{missing} missing (scripts/setup_redis_nginx.sh installs them)")
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def fleet(request: pytest.FixtureRequest) -> Fleet:
    """Stores of replicas sharing one fleet's state (a fresh one per test)."""
    if request.param == "memory":
        state = MemoryState()
        return lambda replica: MemoryStore(replica, state)
    from thunder_mw.state.redis_store import RedisStore

    url = request.getfixturevalue("redis_url")
    settings = StateSettings(backend="redis", url=url, key_prefix=f"t{next(_prefixes)}:")
    return lambda replica: RedisStore(settings, replica)


def record(program_id: str, holder: str) -> ProgramRecord:
    return ProgramRecord(
        program_id=program_id, holder=holder, state="active", phase="acting", backend="e0"
    )


def claim(program_id: str, holder: str, tokens: int, limit: float | None = 1000) -> SyncItem:
    return SyncItem(program_id, "claim", "e0", tokens, limit, record(program_id, holder))


async def started(*stores: SchedulerStore) -> None:
    for store in stores:
        await store.snapshot(ENGINES)  # takes the replica's lease


async def closed(*stores: SchedulerStore) -> None:
    for store in stores:
        await store.close()


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_a_store_of_several_replicas_is_shared(fleet: Fleet) -> None:
    assert fleet("a").shared
    assert not MemoryStore().shared  # one gateway: the live scheduler leaves it alone


def test_the_gate_refuses_growth_past_the_limit_summed_over_live_replicas(fleet: Fleet) -> None:
    async def body() -> None:
        a, b = fleet("a"), fleet("b")
        await started(a, b)
        assert [r.status for r in await a.sync([claim("p", "a", 600)], ENGINES)] == [1]
        (refused,) = await b.sync([claim("q", "b", 500)], ENGINES)
        assert (refused.status, refused.foreign) == (0, 600)
        (fits,) = await b.sync([claim("q", "b", 400)], ENGINES)
        assert (fits.status, fits.foreign) == (1, 600)
        assert await a.snapshot(ENGINES) == {"e0": (400, 1000), "e1": (0, 0)}
        await closed(a, b)

    run(body())


def test_an_engine_nobody_reserves_admits_any_program(fleet: Fleet) -> None:
    async def body() -> None:
        a = fleet("a")
        await started(a)
        (result,) = await a.sync([claim("big", "a", 5000)], ENGINES)
        assert result.status == 1
        await closed(a)

    run(body())


def test_a_shrinking_or_dropped_reservation_frees_room(fleet: Fleet) -> None:
    async def body() -> None:
        a = fleet("a")
        await started(a)
        await a.sync([claim("p", "a", 600)], ENGINES)
        (smaller,) = await a.sync([claim("p", "a", 200)], ENGINES)
        assert smaller.freed
        (same,) = await a.sync([claim("p", "a", 200)], ENGINES)
        assert not same.freed
        (dropped,) = await a.sync([SyncItem("p", "drop")], ENGINES)
        assert dropped.freed and await a.load("p") is None
        assert await a.snapshot(ENGINES) == {"e0": (0, 0), "e1": (0, 0)}
        await closed(a)

    run(body())


def test_a_record_another_live_replica_holds_is_refused_unless_claimed(fleet: Fleet) -> None:
    async def body() -> None:
        a, b = fleet("a"), fleet("b")
        await started(a, b)
        await a.sync([claim("p", "a", 100)], ENGINES)
        update = SyncItem("p", "update", "e0", 100, 1000, record("p", "b"))
        assert [r.status for r in await b.sync([update], ENGINES)] == [-1]
        assert [r.status for r in await b.sync([claim("p", "b", 100)], ENGINES)] == [1]
        loaded = await a.load("p")
        assert loaded is not None and loaded.holder == "b"
        assert [r.status for r in await a.sync([update], ENGINES)] == [-1]
        await closed(a, b)

    run(body())


def test_records_load_one_by_one_and_all_at_once(fleet: Fleet) -> None:
    async def body() -> None:
        a = fleet("a")
        await started(a)
        await a.sync([claim("p", "a", 10), claim("q", "a", 20)], ENGINES)
        one = await a.load("q")
        assert one is not None and one.program_id == "q" and one.backend == "e0"
        assert sorted(r.program_id for r in await a.load_all()) == ["p", "q"]
        assert await a.load("nobody") is None
        await closed(a)

    run(body())


def test_an_ended_lease_stops_the_replicas_reservations_counting(fleet: Fleet) -> None:
    async def body() -> None:
        a, b = fleet("a"), fleet("b")
        await started(a, b)
        await a.sync([claim("p", "a", 900)], ENGINES)
        assert (await b.snapshot(ENGINES))["e0"] == (900, 900)
        await a.end_lease()
        assert (await b.snapshot(ENGINES))["e0"] == (0, 0)
        (result,) = await b.sync([claim("q", "b", 900)], ENGINES)
        assert (result.status, result.foreign) == (1, 0)
        await closed(a, b)

    run(body())


def test_every_replica_digests_owner_keys_with_the_same_key(fleet: Fleet) -> None:
    async def body() -> None:
        a, b = fleet("a"), fleet("b")
        key = await a.owner_key()
        assert len(key) == 32 and await b.owner_key() == key
        await closed(a, b)

    run(body())


def test_an_announcement_reaches_the_listening_replicas(fleet: Fleet) -> None:
    async def body() -> None:
        a, b = fleet("a"), fleet("b")
        heard: list[list[str]] = []
        b.listen(heard.append)

        async def announced() -> list[str] | None:
            # A subscription takes a moment to reach the server: announce until it is heard.
            await a.publish("room", "a")
            return heard[0] if heard else None

        assert await wait_until_async(announced, 5.0, message="the announcement") == ["room", "a"]
        await closed(a, b)

    run(body())
