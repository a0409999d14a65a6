"""Shows the simulator is never the bottleneck: engine steps/s in-process, HTTP requests/s.

python -m thunder_mw.lab.sim_perf   # writes ./results/sim-perf.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams
from thunder_mw.sim.tokenizer import RuleTokenizer

__all__ = ["OUTPUT", "engine_steps_per_second", "http_requests_per_second", "main"]

OUTPUT = RESULTS_DIR / "sim-perf.json"


def engine_steps_per_second(running: int = 256, steps: int = 20_000) -> float:
    """Decode steps/s with `running` sequences, block size 16 (a block boundary every 16 steps)."""
    engine = Engine(
        EngineConfig(
            num_blocks=400_000,
            block_size=16,
            max_num_seqs=running,
            max_model_len=1 << 30,
            profile="h100-8b",
        ),
        RuleTokenizer().filler_ids,
    )
    for i in range(running):
        engine.add_request(
            str(i),
            [i + 1] * 10 + list(range(1000)),
            SamplingParams(max_tokens=10**6, ignore_eos=True),
        )
    while engine.num_running < running or engine._prefilling:
        engine.step()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return steps / (time.perf_counter() - t)


def http_requests_per_second(duration_s: float = 5.0, concurrency: int = 32) -> float:
    """Short requests (8-token prompt, 1 output token) against `sim-engine` pinned to one core."""
    port = 18931
    code = (
        "import argparse,sys;from thunder_mw.sim.server import *;"
        "p=argparse.ArgumentParser();add_sim_engine_arguments(p);"
        "sys.exit(run_sim_engine(p.parse_args()))"
    )
    cmd = [sys.executable, "-c", code, "--port", str(port), "--profile", "instant"]
    if os.path.exists("/usr/bin/taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(url, timeout_s=10, process=proc)
        return _drive(url, duration_s, concurrency)
    finally:
        proc.terminate()
        proc.wait(10)


def _drive(url: str, duration_s: float, concurrency: int) -> float:
    import asyncio

    import aiohttp  # sets TCP_NODELAY; an httpx client here measured Nagle's 40 ms, not the sim

    async def main() -> float:
        done = 0
        end = time.perf_counter() + duration_s
        body = {"prompt": "a short request here", "max_tokens": 1}
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(url, connector=connector) as client:

            async def worker() -> None:
                nonlocal done
                while time.perf_counter() < end:
                    async with client.post("/v1/completions", json=body) as r:
                        r.raise_for_status()
                        await r.read()
                    done += 1

            t = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return done / (time.perf_counter() - t)

    return asyncio.run(main())


def _spread(values: list[float]) -> dict[str, int]:
    ordered = sorted(values)
    return {
        "min": round(ordered[0]),
        "median": round(ordered[len(ordered) // 2]),
        "max": round(ordered[-1]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    repeats = args.repeats
    steps = _spread([engine_steps_per_second() for _ in range(repeats)])
    rps = _spread([http_requests_per_second() for _ in range(repeats)])
    result = {
        "engine_steps_per_s_256_running": steps["median"],
        "http_requests_per_s_one_core": rps["median"],
        "runs": repeats,
        "engine_steps_per_s_spread": steps,
        "http_requests_per_s_spread": rps,
        "targets": {"engine_steps_per_s": 20_000, "http_requests_per_s": 1_000},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "note": "the HTTP load generator runs on the other core; both share the machine",
    }
    write_result(args.output, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
