"""Idle gaps: agent programs whose tool gaps land on every keep-alive timeout, and no lost call.

Agents call in bursts separated by tool gaps of seconds, the very idle times at which servers
close keep-alive connections (uvicorn, under vLLM, SGLang and thunder-mw itself: 5 s unless
told otherwise; aiohttp's client pool: 15 s; httpx's and the OpenAI client's: 5 s). Here
programs call with gaps drawn log-uniformly over 0.1-30 s, so many fall near 5 s and 15 s,
through `thunder-mw serve` (its own process, real sockets) to

  (a) `thunder-mw sim-engine` processes: real uvicorn servers with uvicorn's 5 s keep-alive;
  (b) the real vLLM CPU engine (tiny model, a few tokens per call).

A quarter of the programs use the OpenAI Python client (`extra_body={"program_id": ...}`), the
rest aiohttp; neither retries anything (the OpenAI client's `max_retries=0`), so every call
that fails anywhere is counted. Half the calls stream. The gateway's own resends of calls lost
on a stale engine connection are read from its /metrics. Target: 0 failed calls.

    python -m thunder_mw.benchmarks.idle_gaps [--parts sim,vllm] [--output PATH]

Writes `results/idle-gaps.json`: calls, failures by status and by cause, releases, the
gateway's resends, wall time, and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import shlex
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from thunder_mw.benchmarks.live import Gateway
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.soak import MODEL as SIM_MODEL
from thunder_mw.benchmarks.soak import sim_engines
from thunder_mw.sim.ports import free_port

__all__ = [
    "DEFAULT_OUTPUT",
    "HOST",
    "NO_RESPONSE",
    "Part",
    "drive",
    "log_uniform",
    "main",
    "run_part",
    "run_sim",
    "run_vllm",
]

DEFAULT_OUTPUT = RESULTS_DIR / "idle-gaps.json"
HOST = "127.0.0.1"
NO_RESPONSE = "no response"


@dataclass
class Part:
    """One run: its programs' shape and what came back."""

    name: str
    programs: int
    calls_per_program: int
    max_tokens: int
    model: str
    calls: int = 0
    ok: int = 0
    by_client: Counter[str] = field(default_factory=Counter)
    failures_by_status: Counter[str] = field(default_factory=Counter)
    failures_by_cause: Counter[str] = field(default_factory=Counter)
    releases_failed: Counter[str] = field(default_factory=Counter)
    gaps: list[float] = field(default_factory=list)
    down_samples: int = 0  # /health samples (1 s apart) showing an engine marked down
    samples: int = 0

    def fail(self, status: str, cause: str) -> None:
        self.failures_by_status[status] += 1
        self.failures_by_cause[cause] += 1


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _uniform(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)


def _cause(exc: BaseException) -> str:
    inner = exc.__cause__ or exc.__context__
    name = type(exc).__name__
    if inner is not None and type(inner).__name__ != name:
        name += f" ({type(inner).__name__})"
    return name


def _error_cause(status: int, body: bytes) -> str:
    try:
        error = json.loads(body)["error"]
        return f"{status} {error.get('code')}: {str(error.get('message'))[:120]}"
    except (ValueError, KeyError, TypeError):
        return f"{status}: {body[:120]!r}"


# ------------------------------------------------------------------ the two clients
async def _aiohttp_call(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], part: Part
) -> None:
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as r:
            data = await r.read()
            if r.status != 200:
                part.fail(str(r.status), _error_cause(r.status, data))
                return
            if body.get("stream") and (b"data: [DONE]" not in data or b'"error"' in data):
                part.fail("200", "stream ended without [DONE] or with an error event")
                return
    except (aiohttp.ClientError, TimeoutError) as exc:
        part.fail(NO_RESPONSE, f"aiohttp: {_cause(exc)}")
        return
    part.ok += 1


async def _openai_call(client: Any, body: dict[str, Any], part: Part) -> None:
    import openai

    extra = {"program_id": body["program_id"]}
    kwargs = {
        "model": body["model"],
        "messages": body["messages"],
        "max_tokens": body["max_tokens"],
    }
    try:
        if body.get("stream"):
            stream = await client.chat.completions.create(**kwargs, stream=True, extra_body=extra)
            async for _ in stream:
                pass
        else:
            await client.chat.completions.create(**kwargs, extra_body=extra)
    except openai.APIStatusError as exc:
        part.fail(str(exc.status_code), _error_cause(exc.status_code, exc.response.content))
        return
    except openai.APIConnectionError as exc:
        part.fail(NO_RESPONSE, f"openai: {_cause(exc)}")
        return
    except openai.APIError as exc:  # an error event inside a stream
        part.fail("200", f"openai stream error: {str(exc)[:120]}")
        return
    part.ok += 1


async def _program(
    index: int,
    url: str,
    part: Part,
    args: argparse.Namespace,
    session: aiohttp.ClientSession,
    openai_client: Any,
    rng: random.Random,
) -> None:
    program_id = f"idle-{part.name}-{index:04d}"
    uses_openai = index % args.openai_every == 0
    client_name = "openai" if uses_openai else "aiohttp"
    draw = log_uniform if args.gap_distribution == "log-uniform" else _uniform
    gaps = [draw(rng, args.min_gap_s, args.max_gap_s) for _ in range(part.calls_per_program)]
    part.gaps.extend(gaps[1:])
    # Programs start spread over the first gap, not all at once.
    await asyncio.sleep(rng.uniform(0, args.min_gap_s) + rng.uniform(0, 5.0))
    for step in range(part.calls_per_program):
        if step:
            await asyncio.sleep(gaps[step])
        body = {
            "model": part.model,
            "messages": [
                {"role": "system", "content": f"You are agent {index}."},
                {"role": "user", "content": f"Step {step}: run the next tool and report."},
            ],
            "max_tokens": part.max_tokens,
            "stream": (index + step) % 2 == 1,
            "program_id": program_id,
        }
        part.calls += 1
        part.by_client[client_name] += 1
        if uses_openai:
            await _openai_call(openai_client, body, part)
        else:
            await _aiohttp_call(session, url, body, part)
    try:
        release = {"program_id": program_id}
        async with session.post(f"{url}/programs/release", json=release) as r:
            await r.read()
            if r.status != 200:
                part.releases_failed[str(r.status)] += 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        part.releases_failed[_cause(exc)] += 1


async def _watch_health(url: str, part: Part, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        while not stop.is_set():
            try:
                backends = (await client.get(f"{url}/health")).json()["backends"]
                part.samples += 1
                part.down_samples += any(not b["healthy"] for b in backends)
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass


async def drive(url: str, part: Part, args: argparse.Namespace) -> None:
    import openai

    rng = random.Random(f"{args.seed}-{part.name}")
    stop = asyncio.Event()
    # Each client with its library's default pool: aiohttp keeps idle connections 15 s,
    # the OpenAI client (httpx) 5 s.
    timeout = aiohttp.ClientTimeout(total=args.call_timeout_s)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session,
        openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=args.call_timeout_s
        ) as openai_client,
    ):
        watcher = asyncio.create_task(_watch_health(url, part, stop))
        programs = [
            _program(i, url, part, args, session, openai_client, random.Random(rng.random()))
            for i in range(part.programs)
        ]
        await asyncio.gather(*programs)
        stop.set()
        await watcher


def _gateway_retries(url: str) -> int:
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("thunder_mw_backend_stale_connection_retries_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _gateway_config(backends: list[dict[str, Any]]) -> dict[str, Any]:
    # Everything at its default but the port and the log: the defaults are what is measured.
    return {
        "server": {"host": HOST, "port": free_port(), "log_level": "warning"},
        "backends": backends,
        "observability": {"decision_log": False},
    }


def run_part(
    part: Part, backends: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    t0 = time.monotonic()
    with Gateway(_gateway_config(backends)) as gateway:
        asyncio.run(drive(gateway.url, part, args))
        retries = _gateway_retries(gateway.url)
    wall = time.monotonic() - t0
    gaps = sorted(part.gaps)
    failed = part.calls - part.ok
    print(
        f"{part.name}: {part.calls} calls, {failed} failed, {retries} gateway resends, "
        f"{wall:.0f} s",
        file=sys.stderr,
    )
    return {
        "programs": part.programs,
        "calls_per_program": part.calls_per_program,
        "max_tokens": part.max_tokens,
        "calls": part.calls,
        "ok": part.ok,
        "failed": failed,
        "failures_by_status": dict(part.failures_by_status),
        "failures_by_cause": dict(part.failures_by_cause),
        "calls_by_client": dict(part.by_client),
        "releases": part.programs,
        "releases_failed": dict(part.releases_failed),
        "gateway_stale_connection_retries": retries,
        "health_samples": part.samples,
        "health_samples_with_an_engine_down": part.down_samples,
        "gaps": {
            "count": len(gaps),
            "min_s": round(gaps[0], 3) if gaps else None,
            "median_s": round(gaps[len(gaps) // 2], 3) if gaps else None,
            "max_s": round(gaps[-1], 3) if gaps else None,
            "within_4_to_6_s": sum(1 for g in gaps if 4 <= g <= 6),
            "within_14_to_16_s": sum(1 for g in gaps if 14 <= g <= 16),
        },
        "wall_s": round(wall, 1),
    }


def run_sim(args: argparse.Namespace) -> dict[str, Any]:
    part = Part("sim", args.sim_programs, args.sim_calls, max_tokens=4, model=SIM_MODEL)
    if args.sim_embedded:
        # `type: sim`: the engines' uvicorn servers run on the gateway's own event loop.
        sim = {"time_scale": 1000.0, "num_blocks": 4096, "model_name": SIM_MODEL}
        backends = [
            {"name": f"sim-{i}", "type": "sim", "sim": {**sim, "seed": i}}
            for i in range(args.sim_engines)
        ]
        result = run_part(part, backends, args)
        result["engines"] = f"{args.sim_engines} x type: sim (embedded uvicorn, 5 s keep-alive)"
        return result
    with sim_engines(args.sim_engines) as engines:
        backends = [{"name": f"sim-{i}", "url": url} for i, (url, _) in enumerate(engines)]
        result = run_part(part, backends, args)
    result["engines"] = f"{args.sim_engines} x thunder-mw sim-engine (uvicorn, 5 s keep-alive)"
    return result


def run_vllm(args: argparse.Namespace) -> dict[str, Any]:
    from thunder_mw.benchmarks.vllm_cpu import SERVED_MODEL_NAME, start_vllm

    part = Part("vllm", args.vllm_programs, args.vllm_calls, max_tokens=2, model=SERVED_MODEL_NAME)
    with ExitStack() as stack:
        engine = stack.enter_context(start_vllm(num_blocks=None, startup_timeout_s=300))
        result = run_part(part, [{"name": "vllm", "url": engine.url}], args)
    result["engines"] = "1 x vLLM CPU engine (tiny model; its uvicorn's 5 s keep-alive)"
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="sim,vllm", help="sim, vllm, or both (comma-separated)")
    p.add_argument("--sim-programs", type=int, default=400)
    p.add_argument("--sim-calls", type=int, default=25, help="calls per program (sim)")
    p.add_argument("--sim-engines", type=int, default=2)
    p.add_argument(
        "--sim-embedded",
        action="store_true",
        help="`type: sim` engines inside the gateway process instead of sim-engine processes",
    )
    p.add_argument("--vllm-programs", type=int, default=50)
    p.add_argument("--vllm-calls", type=int, default=20, help="calls per program (vLLM)")
    p.add_argument("--min-gap-s", type=float, default=0.1)
    p.add_argument("--max-gap-s", type=float, default=30.0)
    p.add_argument(
        "--gap-distribution",
        choices=("log-uniform", "uniform"),
        default="log-uniform",
        help="uniform with --min-gap-s 4.95 --max-gap-s 5.05: every gap at uvicorn's timeout",
    )
    p.add_argument("--openai-every", type=int, default=4, help="every Nth program: OpenAI client")
    p.add_argument("--call-timeout-s", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", "--out", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args(argv)
    parts = [name.strip() for name in args.parts.split(",") if name.strip()]
    unknown = set(parts) - {"sim", "vllm"}
    if unknown or not parts:
        p.error(f"--parts: sim and/or vllm, not {sorted(unknown) or 'nothing'}")

    results: dict[str, Any] = {}
    if "sim" in parts:
        results["sim"] = run_sim(args)
    if "vllm" in parts:
        results["vllm"] = run_vllm(args)
    calls = sum(r["calls"] for r in results.values())
    failed = sum(r["failed"] for r in results.values())
    command = ["python", "-m", "thunder_mw.benchmarks.idle_gaps", *(argv or sys.argv[1:])]
    report = {
        "benchmark": "idle-gaps",
        "command": shlex.join(command),
        "config": {
            **{k: v for k, v in vars(args).items() if k != "output"},
            "gaps": "log-uniform over [min_gap_s, max_gap_s] between a program's calls",
            "clients": "every openai_every-th program: openai.AsyncOpenAI (httpx pool, 5 s "
            "keep-alive, max_retries=0); the rest: aiohttp (15 s keep-alive, no retries); "
            "half the calls stream",
            "gateway": "thunder-mw serve, defaults (backends[].pool_keep_alive_s 4, "
            "server.client_keep_alive_s 75, failures_to_open 3, probe_interval_s 5)",
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "total": {"calls": calls, "failed": failed},
        "parts": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.output, report, indent=1)
    print(json.dumps(report["total"]))
    return 0 if failed == 0 and not any(r["releases_failed"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
