"""Two `thunder-mw serve` replicas sharing one real redis-server, behind the shipped nginx
config, in front of a simulated engine (docs/replicas.md): shared admission, a replica
killed with SIGKILL, a restart, Redis going away."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from support.polling import wait_until

from thunder_mw.benchmarks.live import Gateway
from thunder_mw.lab.replica_stack import (
    Nginx,
    RedisServer,
    holders,
    kill_replica,
    missing_binaries,
    replica_config,
    reservations,
    sim_engine,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

# 256 blocks x 16 tokens: 4,096 tokens of KV; at high watermark 1.0 about seven of the
# ~530-token requests below fit at once, so twenty concurrent programs must queue.
NUM_BLOCKS, BLOCK_SIZE, HIGH = 256, 16, 1.0
CAPACITY = NUM_BLOCKS * BLOCK_SIZE
POLICIES: list[dict[str, Any]] = [
    {"admission": {"high_watermark": HIGH, "low_watermark": 0.9, "overflow": "hold"}},
    {"state_aware_pause": {}},
    {"migration": {}},
    {"gc_hooks": {}},
]
PROMPT = "word " * 80  # ~100 tokens by the core's estimate


@pytest.fixture(scope="module", autouse=True)
def binaries() -> None:
    missing = missing_binaries()
    if missing:
        if os.environ.get("THUNDER_MW_REQUIRE_REAL") == "1":
            pytest.fail(f"{missing} missing (scripts/setup_redis_nginx.sh)")
        pytest.skip(f"{missing} missing (scripts/setup_redis_nginx.sh installs them)")


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def redis_server(stack: ExitStack) -> RedisServer:
    server = RedisServer().start()
    stack.callback(server.close)
    return server


@pytest.fixture
def engine(stack: ExitStack) -> str:
    return stack.enter_context(
        sim_engine(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, time_scale=4.0)
    )


def replica(stack: ExitStack, engine: str, redis_server: RedisServer, **kw: Any) -> Gateway:
    config = replica_config([engine], redis_server.url, policies=POLICIES, **kw)
    return stack.enter_context(Gateway(config))


def body(program: str, max_tokens: int = 300) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "program_id": program,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
    }


def step(url: str, program: str, max_tokens: int = 300) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body(program, max_tokens), timeout=60)


def view(url: str, program: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/programs/{program}", timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def record_steps(client: Any, program: str) -> int | None:
    raw = client.get(f"thunder-mw:prog:{program}")
    return None if raw is None else int(json.loads(raw)["steps"])


# ------------------------------------------------------------------ shared admission
def test_two_replicas_never_reserve_past_the_engines_watermark_together(
    stack: ExitStack, redis_server: RedisServer, engine: str
) -> None:
    a = replica(stack, engine, redis_server)
    b = replica(stack, engine, redis_server)
    client = redis_server.client()
    samples: list[int] = []
    queued: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(sum(reservations(client).get("e0", {}).values()))
            queued.append(client.zcard("thunder-mw:queue"))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as http:
            calls = [
                http.post(f"{gateway.url}/v1/chat/completions", json=body(f"{name}{i}"))
                for i in range(10)
                for name, gateway in (("a", a), ("b", b))
            ]
            return [r.status_code for r in await asyncio.gather(*calls)]

    try:
        statuses = asyncio.run(run())
    finally:
        stop.set()
        sampler.join()
    assert statuses == [200] * 20
    programs = [
        view(gateway.url, f"{name}{i}") for i in range(10) for name, gateway in (("a", a), ("b", b))
    ]
    # Twenty ~530-token requests never fit at once in 4,096 tokens: some had to wait, and
    # what Redis held never went past capacity x high watermark.
    assert sum(p["steps"] for p in programs) == 20
    assert max(samples) > CAPACITY * HIGH / 2
    assert max(samples) <= CAPACITY * HIGH
    # The programs waiting for room were listed in Redis's queue, and none is left there.
    assert max(queued) > 0
    assert client.zcard("thunder-mw:queue") == 0


# ------------------------------------------------------------------ a replica killed
def test_a_killed_replica_loses_nothing_but_its_requests_and_its_reservations_expire(
    stack: ExitStack, redis_server: RedisServer, engine: str
) -> None:
    a = replica(stack, engine, redis_server, lease_ttl_s=1.0)
    b = replica(stack, engine, redis_server, lease_ttl_s=1.0)
    nginx = Nginx([int(a.url.rsplit(":", 1)[1]), int(b.url.rsplit(":", 1)[1])]).start()
    stack.callback(nginx.close)
    client = redis_server.client()
    # Round robin (the program is named in the body): its steps alternate between replicas.
    for _ in range(4):
        assert step(nginx.url, "kept", 20).status_code == 200
    placed = view(a.url, "kept")["backend"]
    # A holds a reservation now (its last call went through a or b; make it a).
    assert step(a.url, "kept", 20).status_code == 200
    assert step(a.url, "other", 20).status_code == 200
    held_by_a = holders(client)
    assert len(held_by_a) == 1
    # What a wrote in the background after those calls ended (within milliseconds) is there
    # before the kill; a kill inside that window loses those counters, not the programs.
    for program, steps in (("kept", 5), ("other", 1)):

        def written(program: str = program, steps: int = steps) -> bool:
            return record_steps(client, program) == steps

        wait_until(
            written,
            10,
            interval_s=0.01,
            message=f"{program}'s record at {steps} steps",
        )
        assert record_steps(client, program) == steps
    kill_replica(a)
    # Its lease is not renewed any more: its reservations stop counting once it lapses
    # (at most lease_ttl_s after its last renewal), reaped by b's next look at the engine.
    wait_until(
        lambda: not holders(client) & held_by_a,
        30,
        interval_s=0.1,
        message="the killed replica's reservations to lapse",
    )
    assert not holders(client) & held_by_a
    # Through nginx, every request now reaches b, which carries on with the same placement
    # and the counters a left.
    for _ in range(3):
        assert step(nginx.url, "kept", 20).status_code == 200
    seen = view(b.url, "kept")
    assert seen["backend"] == placed
    assert seen["steps"] == 8
    assert step(nginx.url, "other", 20).status_code == 200
    assert view(b.url, "other")["steps"] == 2


# ------------------------------------------------------------------ restart
def test_a_restarted_replica_finds_every_program(
    stack: ExitStack, redis_server: RedisServer, engine: str
) -> None:
    config = replica_config([engine], redis_server.url, policies=POLICIES)
    first = Gateway(config).__enter__()
    try:
        for program in ("r1", "r2"):
            for _ in range(2):
                assert step(first.url, program, 20).status_code == 200
        kill_replica(first)
    finally:
        first.__exit__(None, None, None)
    again = stack.enter_context(Gateway(config))
    answer = httpx.get(f"{again.url}/programs", timeout=10).json()
    listed = {p["program_id"]: p for p in answer["programs"]}
    assert {"r1", "r2"} <= set(listed)
    assert listed["r1"]["steps"] == 2 and listed["r1"]["backend"] == "e0"
    assert step(again.url, "r1", 20).status_code == 200
    assert view(again.url, "r1")["steps"] == 3


# ------------------------------------------------------------------ Redis away
def test_redis_down_fails_open_or_closed_as_configured(
    stack: ExitStack, redis_server: RedisServer, engine: str
) -> None:
    open_ = replica(stack, engine, redis_server, on_unavailable="fail_open")
    closed = replica(stack, engine, redis_server, on_unavailable="fail_closed")
    for url in (open_.url, closed.url):
        assert step(url, "before", 20).status_code == 200
    assert step(open_.url, "open-only", 20).status_code == 200
    redis_server.kill()
    # A program a replica holds is still shown from its own table; one it would have to read
    # from Redis is a 503 that says so, not a 404 that says there is no such program.
    assert view(open_.url, "open-only")["steps"] == 1
    unknown = httpx.get(f"{open_.url}/programs/elsewhere", timeout=10)
    assert unknown.status_code == 503 and unknown.json()["error"]["code"] == "state_unavailable"
    assert unknown.headers["retry-after"] == "1"
    assert step(open_.url, "during-open", 20).status_code == 200
    assert step(open_.url, "before", 20).status_code == 200
    refused = step(closed.url, "during-closed", 20)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "state_unavailable"
    assert refused.headers["retry-after"] == "1"
    # Redis back (empty: it kept nothing on disk): both replicas write their programs again.
    back = RedisServer(redis_server.port).start()
    stack.callback(back.close)
    wait_until(
        lambda: step(closed.url, "after", 20).status_code == 200,
        30,
        interval_s=0.2,
        message="a 200 from the replica once Redis is back",
    )
    client = back.client()
    wait_until(
        lambda: client.get("thunder-mw:prog:during-open") is not None,
        30,
        interval_s=0.1,
        message="during-open's record written again",
    )
    assert client.get("thunder-mw:prog:during-open") is not None


# ------------------------------------------------------------------ owners
def test_a_program_bound_to_a_key_on_one_replica_is_refused_to_another_key_on_the_other(
    stack: ExitStack, redis_server: RedisServer, engine: str
) -> None:
    def owned(**kw: Any) -> Gateway:
        config = replica_config([engine], redis_server.url, policies=POLICIES, **kw)
        config["agent_context"] = {"program_owner": "header"}
        return stack.enter_context(Gateway(config))

    a, b = owned(), owned()

    def as_key(url: str, key: str) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/chat/completions",
            json=body("owned", 20),
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        )

    assert as_key(a.url, "key-1").status_code == 200
    wait_until(
        lambda: record_steps(redis_server.client(), "owned") == 1,
        10,
        interval_s=0.01,
        message="owned's record at 1 step",
    )
    refused = as_key(b.url, "key-2")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "program_owned_by_another_key"
    assert as_key(b.url, "key-1").status_code == 200
    assert as_key(a.url, "key-2").status_code == 403
    assert view(b.url, "owned")["steps"] == 2


# ------------------------------------------------------------------ program views
def test_every_replica_answers_for_a_program_another_one_holds(
    stack: ExitStack, redis_server: RedisServer, engine: str
) -> None:
    a = replica(stack, engine, redis_server)
    b = replica(stack, engine, redis_server)
    client = redis_server.client()
    for _ in range(2):
        assert step(a.url, "seen", 20).status_code == 200
    wait_until(
        lambda: record_steps(client, "seen") == 2,
        10,
        interval_s=0.01,
        message="seen's record at 2 steps",
    )
    on_a, on_b = view(a.url, "seen"), view(b.url, "seen")
    # The same view on both, from a's table on a and from the shared record on b, naming a
    # as the replica that holds it.
    assert set(on_b) == set(on_a)
    assert on_b["holder"] == on_a["holder"] and on_a["holder"] in holders(client)
    for name in (
        "state",
        "phase",
        "backend",
        "steps",
        "failures",
        "context_tokens",
        "reserved_tokens",
        "prompt_tokens",
        "completion_tokens",
        "in_flight",
        "waiting",
        "source",
    ):
        assert on_b[name] == on_a[name], name
    assert on_a["steps"] == 2 and on_a["reserved_tokens"] > 0
    assert abs(on_b["age_s"] - on_a["age_s"]) < 5 and on_b["idle_s"] >= 0
    # b only read the record: it did not take the program over, nor list it as its own.
    listed = httpx.get(f"{b.url}/programs", timeout=10).json()["programs"]
    assert "seen" not in {p["program_id"] for p in listed}
    assert view(a.url, "seen")["holder"] == on_a["holder"]
    # A program b holds names b; one no replica has is a 404 on every replica.
    assert step(b.url, "mine", 20).status_code == 200
    assert view(b.url, "mine")["holder"] != on_a["holder"]
    for url in (a.url, b.url):
        missing = httpx.get(f"{url}/programs/nobody", timeout=10)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "program_not_found"
    # Released on a: its record goes, and b answers 404 too.
    released = httpx.post(f"{a.url}/programs/release", json={"program_id": "seen"}, timeout=10)
    assert released.json()["released"] is True
    wait_until(
        lambda: client.get("thunder-mw:prog:seen") is None,
        10,
        interval_s=0.01,
        message="seen's record to go",
    )
    assert httpx.get(f"{b.url}/programs/seen", timeout=10).status_code == 404
