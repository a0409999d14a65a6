"""RL rollout through the live gateway: programs in waves over SGLang's native /generate, an
engine added and one drained mid-wave, a weight update between waves; no program may fail.

`thunder-mw serve` (its own process) runs two embedded simulated SGLang engines (`type: sim`,
an illustrative H100 + 8B cost profile). Each wave starts `--programs` agent programs, each a
chain of `--steps` /generate calls (rid `<program>::<step>`, the prompt growing by the last
answer plus a tool observation, a tool gap between calls). In wave 1 an engine joins a third of
the way in (`POST /backends`) and sim-0 drains half-way (`DELETE /backends/sim-0`). As the
last programs of a wave finish, `POST /weights/update` runs a whole cycle while the next wave
starts, so its first calls are held at the gateway and released after the update.

    python -m thunder_mw.benchmarks.rollout [--waves 3] [--programs 32] [--output PATH]
    thunder-mw bench --scenario rollout

Writes `results/rollout.json`: per wave its steps, programs failed, wall time, steps per
minute (wall clock; the engines run 10x faster than real time) and where programs ran; per
update its cycle time, held calls released and the engines' answers; and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from thunder_mw.benchmarks.live import Gateway
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.sim.ports import free_port

__all__ = ["DEFAULT_OUTPUT", "SIM", "Wave", "drive", "main"]

DEFAULT_OUTPUT = RESULTS_DIR / "rollout.json"
SIM = {
    "flavor": "sglang",
    "num_blocks": 4096,
    "block_size": 16,
    "profile": "h100-8b",
    "time_scale": 10.0,
}


def _engine(name: str, seed: int) -> dict[str, Any]:
    return {"name": name, "type": "sim", "sim": {**SIM, "seed": seed}}


class Wave:
    def __init__(self, index: int) -> None:
        self.index = index
        self.steps = 0
        self.failed_programs: set[str] = set()
        self.failures: Counter[str] = Counter()
        self.homes: Counter[str] = Counter()
        self.completion_tokens = 0
        self.started = time.monotonic()
        self.ended = 0.0
        self.done = 0


async def _program(
    client: httpx.AsyncClient,
    wave: Wave,
    name: str,
    args: argparse.Namespace,
    rng: random.Random,
) -> None:
    text = f"task {name}: " + "context " * args.prompt_words
    for step in range(args.steps):
        body = {
            "text": text,
            "sampling_params": {"max_new_tokens": args.max_new_tokens, "ignore_eos": True},
            "rid": f"{name}::{step}",
        }
        try:
            answer = await client.post("/generate", json=body)
            ok = answer.status_code == 200 and "meta_info" in answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            wave.failures[type(exc).__name__] += 1
            wave.failed_programs.add(name)
            return
        if not ok:
            wave.failures[str(answer.status_code)] += 1
            wave.failed_programs.add(name)
            return
        wave.steps += 1
        wave.completion_tokens += answer.json()["meta_info"]["completion_tokens"]
        text += answer.json()["text"] + " observation " * args.observation_words
        await asyncio.sleep(rng.uniform(0.5, 1.5) * args.tool_gap_s)
    program = (await client.get(f"/programs/{name}")).json()
    wave.homes[program.get("backend") or "none"] += 1
    await client.post("/programs/release", json={"program_id": name})
    wave.done += 1


async def _close(wave: Wave, tasks: list[asyncio.Task[None]]) -> None:
    await asyncio.gather(*tasks)
    wave.ended = time.monotonic()


async def _until(condition: Any) -> None:
    """Polls a counter the program tasks advance (50 ms is fine next to their tool gaps)."""
    while not condition():  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def _fleet_events(client: httpx.AsyncClient, wave: Wave, total: int, log: list[Any]) -> None:
    """Wave 1: an engine joins a third of the way in, sim-0 drains half-way."""
    await _until(lambda: wave.done >= total // 3)
    t = time.monotonic()
    added = await client.post("/backends", json=_engine("sim-2", 2))
    log.append(
        {"event": "add sim-2", "status": added.status_code, "s": round(time.monotonic() - t, 3)}
    )
    await _until(lambda: wave.done >= total // 2)
    programs = (await client.get("/programs")).json()["programs"]
    placed = sum(1 for p in programs if p["backend"] == "sim-0" and p["state"] == "active")
    in_flight = (await client.get("/generation")).json()["in_flight_calls"]
    drained = await client.delete("/backends/sim-0")
    started = time.monotonic()
    while "sim-0" in {b["name"] for b in (await client.get("/backends")).json()["backends"]}:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    log.append(
        {
            "event": "drain sim-0",
            "status": drained.status_code,
            "programs_placed_on_it": placed,
            "gateway_calls_in_flight": in_flight,
            "left_after_s": round(time.monotonic() - started, 3),
        }
    )


async def _update(client: httpx.AsyncClient, version: str) -> dict[str, Any]:
    t = time.monotonic()
    answer = await client.post(
        "/weights/update",
        json={"mode": "wait", "model_path": f"/ckpt/{version}", "weight_version": version},
    )
    cycle = answer.json()
    return {
        "weight_version": version,
        "status": answer.status_code,
        "success": cycle.get("success"),
        "cycle_s": round(time.monotonic() - t, 3),
        "released_calls": cycle.get("released_calls"),
        "engines": [
            {"backend": e["backend"], "path": e["path"], "ok": e["ok"]}
            for e in cycle.get("engines", [])
        ],
    }


async def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=args.programs * 2)
    timeout = httpx.Timeout(300.0)
    waves: list[Wave] = []
    updates: list[dict[str, Any]] = []
    fleet_log: list[Any] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        pending_update: asyncio.Task[dict[str, Any]] | None = None
        running: list[asyncio.Task[None]] = []
        for w in range(args.waves):
            wave = Wave(w)
            waves.append(wave)
            tasks = [
                asyncio.create_task(
                    _program(client, wave, f"w{w}-p{i}", args, random.Random(rng.random()))
                )
                for i in range(args.programs)
            ]
            running.append(asyncio.create_task(_close(wave, tasks)))
            if w == 1:
                running.append(
                    asyncio.create_task(_fleet_events(client, wave, args.programs, fleet_log))
                )
            if pending_update is not None:
                updates.append(await pending_update)
                pending_update = None
            # As the wave's last programs finish, the update runs and the next wave starts at
            # once: the calls arriving meanwhile are held by the gateway, then released.
            finished = int(args.programs * 0.9)
            await _until(lambda w=wave, n=finished: w.done + len(w.failed_programs) >= n)
            if w + 1 < args.waves:
                pending_update = asyncio.create_task(_update(client, f"step-{w + 1}"))
        if pending_update is not None:
            updates.append(await pending_update)
        await asyncio.gather(*running)
    return {
        "waves": [_wave_report(w, args) for w in waves],
        "weight_updates": updates,
        "fleet_events": fleet_log,
    }


def _wave_report(wave: Wave, args: argparse.Namespace) -> dict[str, Any]:
    wall = wave.ended - wave.started
    return {
        "wave": wave.index,
        "programs": args.programs,
        "steps": wave.steps,
        "programs_failed": len(wave.failed_programs),
        "failures": dict(wave.failures),
        "completion_tokens": wave.completion_tokens,
        "wall_s": round(wall, 2),
        "steps_per_min": round(wave.steps / wall * 60, 1) if wall > 0 else None,
        "programs_last_ran_on": dict(sorted(wave.homes.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thunder_mw.benchmarks.rollout")
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--programs", type=int, default=32, help="Programs per wave.")
    parser.add_argument("--steps", type=int, default=4, help="/generate calls per program.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=200)
    parser.add_argument("--observation-words", type=int, default=100)
    parser.add_argument("--tool-gap-s", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    config = {
        "server": {"host": "127.0.0.1", "port": free_port(), "log_level": "warning"},
        "backends": [_engine("sim-0", 0), _engine("sim-1", 1)],
        "observability": {"decision_log": False},
        "tools": {"docker": {"enabled": False}},
    }
    t0 = time.monotonic()
    with Gateway(config) as gateway:
        report = asyncio.run(drive(gateway.url, args))
        backends = httpx.get(f"{gateway.url}/backends", timeout=10).json()["backends"]
    failed = sum(w["programs_failed"] for w in report["waves"])
    for w in report["waves"]:
        print(
            f"wave {w['wave']}: {w['steps']} steps, {w['steps_per_min']} steps/min, "
            f"{w['programs_failed']} programs failed, last ran on {w['programs_last_ran_on']}",
            file=sys.stderr,
        )
    result = {
        "scenario": "rollout",
        "command": " ".join(
            ["python -m thunder_mw.benchmarks.rollout", shlex.join(argv or sys.argv[1:])]
        ).strip(),
        "engines": "2 embedded simulated SGLang engines (type: sim, h100-8b profile, "
        f"time_scale {SIM['time_scale']}, {SIM['num_blocks']} x {SIM['block_size']}-token "
        "blocks); a third added in wave 1, sim-0 drained in wave 1",
        "gateway": "thunder-mw serve, default scheduler pipeline",
        "programs_failed": failed,
        **report,
        "backends_at_end": [b["name"] for b in backends],
        "wall_s": round(time.monotonic() - t0, 1),
        "python": platform.python_version(),
    }
    write_result(args.output, result)
    print(json.dumps({"programs_failed": failed, "output": str(args.output)}), file=sys.stderr)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
