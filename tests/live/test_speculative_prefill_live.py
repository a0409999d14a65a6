"""Speculative prefill, live: the gateway warms a simulated engine with a moved program's last
prompt and answer; the program's next call finds it cached; no client's usage counts it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
from support.polling import wait_until_async

from thunder_mw.middleware.app import ThunderGateway
from thunder_mw.schemas.config import ThunderConfig

SYSTEM = "You are a careful software engineer. " * 20
TASK = " ".join(f"step{i} of the task" for i in range(300))


def config(memory_bytes: int = 64 * 1024 * 1024) -> ThunderConfig:
    sim = {"num_blocks": 2048, "block_size": 16, "time_scale": 50.0}
    return ThunderConfig(
        backends=[
            {"name": "sim-0", "type": "sim", "sim": {**sim, "seed": 0}},
            {"name": "sim-1", "type": "sim", "sim": {**sim, "seed": 1}},
        ],
        policies=[
            {"admission": {"overflow": "hold"}},
            {"state_aware_pause": {}},
            {"migration": {}},
            {"gc_hooks": {}},
            # Warm at once: the prefetch lead is longer than any expected tool time.
            {
                "speculative_prefill": {
                    "default": True,
                    "min_context_tokens": 0,
                    "prefetch_before_s": 1000,
                }
            },
        ],
        server={"tick_interval_s": 0.02},
        speculative_prefill={"memory_bytes": memory_bytes},
        tools={"docker": {"enabled": False}},
    )


def request(program: str, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": messages,
        "max_tokens": 12,
        "ignore_eos": True,
        "stream": stream,
        "program_id": program,
    }


async def streamed(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The streamed answer's text and the usage the client sees (it asked for it)."""
    text, usage = "", dict[str, Any]()
    body = {**body, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = msgspec.json.decode(line[6:])
            for choice in chunk.get("choices") or ():
                text += (choice.get("delta") or {}).get("content") or ""
            usage = chunk.get("usage") or usage
    return text, usage


def metric(text: str, name: str) -> float:
    """An unlabelled series' value in a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@contextlib.asynccontextmanager
async def gateway(config: ThunderConfig) -> AsyncIterator[tuple[ThunderGateway, httpx.AsyncClient]]:
    """The gateway in process and a client of it, once both engines are probed."""
    app = ThunderGateway(config)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=30
        ) as client:
            await ready(client)
            yield app, client
    finally:
        await app.core.shutdown()


async def ready(client: httpx.AsyncClient) -> None:
    """Until both engines are probed: a drain moves a program only to an engine whose
    capacity is known (else it pauses it, and the test would wait on a resume)."""

    async def done() -> bool:
        backends = (await client.get("/backends")).json()["backends"]
        return all(b["healthy"] and b["capacity_tokens"] for b in backends)

    await wait_until_async(done, 10)


async def acting(client: httpx.AsyncClient, program: str) -> None:
    """Until the gateway has closed the program's call (it answers the client first)."""

    async def done() -> bool:
        view: dict[str, Any] = (await client.get(f"/programs/{program}")).json()
        closed: bool = view["phase"] == "acting" and view["in_flight"] == 0
        return closed

    await wait_until_async(done, 10)


def test_a_program_moved_while_acting_is_warmed_and_its_next_call_hits_the_cache() -> None:
    async def run() -> None:
        async with gateway(config()) as (app, client):
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": TASK},
            ]
            answer, first = await streamed(client, request("p", messages, stream=True))
            await acting(client, "p")
            home = (await client.get("/programs/p")).json()["backend"]
            other = "sim-1" if home == "sim-0" else "sim-0"
            # Its engine is drained while its tool runs: it is moved, and warmed there.
            app.core.scheduler.drain_backend(home)
            ok = f'thunder_mw_speculative_prefills_total{{backend="{other}",outcome="ok"}}'

            async def warmed() -> bool:
                return ok + " 1.0" in (await client.get("/metrics")).text

            await wait_until_async(warmed, 10)
            assert (await client.get("/programs/p")).json()["backend"] == other

            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "ls returned two files"},
            ]
            r = await client.post("/v1/chat/completions", json=request("p", messages, False))
            assert r.status_code == 200
            second = r.json()["usage"]
            # All but the new turn (and a partial block) was already cached on `other`,
            # which had never seen this program before the warming request.
            new_turn = 16 + 16
            assert second["prompt_tokens_details"]["cached_tokens"] >= (
                second["prompt_tokens"] - new_turn
            )
            assert second["prompt_tokens"] > first["prompt_tokens"] > 300
            # The warming request is in no usage: the client's, the program's, its profile's.
            view = (await client.get("/programs/p")).json()
            assert view["prompt_tokens"] == first["prompt_tokens"] + second["prompt_tokens"]
            assert view["steps"] == 2
            profile = (await client.get("/profiles/p")).json()
            assert profile["steps_total"] == 2 and profile["speculative_prefills"] == 1
            assert profile["prompt_tokens"] == view["prompt_tokens"]
            metrics = (await client.get("/metrics")).text
            assert metric(metrics, "thunder_mw_speculative_prefill_memory_programs") == 1
            assert metric(metrics, "thunder_mw_speculative_prefill_memory_bytes") > 0

    asyncio.run(run())


def test_the_byte_budget_evicts_the_least_recent_programs_prompt() -> None:
    async def run() -> None:
        # Room for one program's prompt and answer, not two.
        async with gateway(config(memory_bytes=4000)) as (app, client):
            task = [{"role": "user", "content": TASK[:2500]}]
            for program in ("a", "b"):
                r = await client.post(
                    "/v1/chat/completions", json=request(program, task, stream=False)
                )
                assert r.status_code == 200
                await acting(client, program)  # its answer is stored once its call closes
            metrics = (await client.get("/metrics")).text
            assert metric(metrics, "thunder_mw_speculative_prefill_memory_evictions_total") == 1
            assert metric(metrics, "thunder_mw_speculative_prefill_memory_programs") == 1
            held = metric(metrics, "thunder_mw_speculative_prefill_memory_bytes")
            assert 2500 < held <= 4000
            # "a" was evicted: moving it asks for a warming request with nothing to send.
            home = (await client.get("/programs/a")).json()["backend"]
            app.core.scheduler.drain_backend(home)
            none = 'thunder_mw_speculative_prefills_total{backend="%s",outcome="no_prompt"} 1.0'
            other = "sim-1" if home == "sim-0" else "sim-0"

            async def counted() -> bool:
                return none % other in (await client.get("/metrics")).text

            await wait_until_async(counted, 10)

    asyncio.run(run())
