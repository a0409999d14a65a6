"""End to end: the live gateway schedules more agent programs than two simulated engines hold."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest
from support.asgi_servers import serving

from thunder_mw.middleware.app import create_app
from thunder_mw.policies.core import Action, Paused, Released, Resumed
from thunder_mw.schemas.config import ThunderConfig

PROGRAMS = 12
STEPS = 4
WORDS_PER_TURN = 150  # the simulator counts each of these words as one token


def sim_backend(name: str, seed: int) -> dict[str, Any]:
    return {
        "name": name,
        "type": "sim",
        "sim": {
            "num_blocks": 64,  # 1,024 tokens each: 12 programs of ~700 tokens cannot all fit
            "block_size": 16,
            "profile": "h100-8b",
            "time_scale": 20.0,
            "seed": seed,
        },
    }


async def run_program(client: httpx.AsyncClient, pid: str, rng: random.Random) -> list[int]:
    history = f"You are agent {pid}. Fix the bug."
    statuses = []
    for step in range(STEPS):
        history += " " + " ".join(f"w{step}{i}" for i in range(WORDS_PER_TURN))
        r = await client.post(
            "/v1/chat/completions",
            json={
                "model": "sim-model",
                "messages": [{"role": "user", "content": history}],
                "max_tokens": 16,
                "ignore_eos": True,
                "program_id": pid,
            },
        )
        statuses.append(r.status_code)
        await asyncio.sleep(rng.uniform(0.1, 0.4))  # the tool runs
    r = await client.post("/programs/release", json={"program_id": pid})
    assert r.json() == {"program_id": pid, "released": True}
    return statuses


async def drive(url: str) -> list[list[int]]:
    rng = random.Random(7)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await asyncio.gather(
            *(run_program(client, f"agent-{i}", rng) for i in range(PROGRAMS))
        )


@pytest.mark.slow  # ~5 s
def test_more_programs_than_fit_are_paused_resumed_migrated_and_all_complete() -> None:
    config = ThunderConfig(
        backends=[sim_backend("sim-0", 0), sim_backend("sim-1", 1)],
        policies=[
            {
                "admission": {
                    "high_watermark": 0.95,
                    "low_watermark": 0.8,
                    "buffer_tokens_per_program": 16,
                    "overflow": "hold",
                }
            },
            {"state_aware_pause": {}},
            {"migration": {}},
            {"gc_hooks": {}},
        ],
    )
    app = create_app(config)
    actions: list[Action] = []
    app.core.scheduler.listeners.append(actions.append)
    with serving(app) as gw:
        results = asyncio.run(drive(gw.url))
        programs = httpx.get(f"{gw.url}/programs").json()["programs"]
        health = httpx.get(f"{gw.url}/health").json()
    assert results == [[200] * STEPS] * PROGRAMS  # every call of every program answered
    assert programs == []  # all released: nothing left behind
    paused = [a for a in actions if isinstance(a, Paused)]
    resumed = [a for a in actions if isinstance(a, Resumed) and not a.admitted]
    migrated = [a for a in resumed if a.migrated]
    released = [a for a in actions if isinstance(a, Released)]
    assert paused, "the engines were overfull: some program should have been paused"
    assert resumed and migrated, (len(resumed), len(migrated))
    assert sorted(a.program_id for a in released) == sorted(f"agent-{i}" for i in range(PROGRAMS))
    assert all(b["healthy"] for b in health["backends"])
    core = app.core.scheduler.core
    assert all(b.reserved == 0 for b in core.backends.values())
