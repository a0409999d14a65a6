"""Leak check of the Docker tool manager: N short programs, each handed a sandbox that it
writes to, then released; counts containers left and the managed disk before and after.

Usage: python -m thunder_mw.lab.tool_gc [--programs 200] [--concurrency 16]
Needs a Docker engine and the image from scripts/setup_docker.sh. Writes
results/tool-gc.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import httpx
import yaml

from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.sim.ports import free_port

__all__ = ["IMAGE", "LABEL", "RESULTS", "drive", "main", "managed_disk", "one_program"]

IMAGE = "thunder-mw/sandbox:test"
RESULTS = RESULTS_DIR / "tool-gc.json"
LABEL = "thunder-mw.managed=true"


def managed_disk(client: docker.DockerClient) -> tuple[int, int]:
    """The engine's own size accounting of the managed containers: (bytes, containers)."""
    rows = client.api.containers(all=True, size=True, filters={"label": LABEL})
    return sum(int(r.get("SizeRw") or 0) for r in rows), len(rows)


async def one_program(
    http: httpx.AsyncClient, client: docker.DockerClient, i: int, run: str
) -> dict[str, Any]:
    pid = f"gc-{run[:8]}-{i}"
    t0 = time.perf_counter()
    box = (await http.post(f"/programs/{pid}/sandboxes", json={"template": "box"})).json()
    t1 = time.perf_counter()
    # The agent's tool call leaves 256 KiB in the sandbox's writable layer.
    await asyncio.to_thread(
        client.api.exec_start,
        client.api.exec_create(
            box["container_id"], ["dd", "if=/dev/zero", "of=/tmp/work", "bs=1024", "count=256"]
        )["Id"],
    )
    chat = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "run the tests"}],
        "max_tokens": 4,
        "program_id": pid,
        "docker_ids": [box["container_id"]],
    }
    r = await http.post("/v1/chat/completions", json=chat)
    r.raise_for_status()
    released = (await http.post("/programs/release", json={"program_id": pid})).json()
    return {"warm": box["warm"], "handout_s": t1 - t0, "released": released["released"]}


async def drive(
    url: str, client: docker.DockerClient, n: int, concurrency: int, run: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def bounded(i: int) -> dict[str, Any]:
            async with limit:
                return await one_program(http, client, i, run)

        results = await asyncio.gather(*(bounded(i) for i in range(n)))
        peak = (await http.get("/health")).json()["tools"]["docker"]
    return results, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    client = docker.from_env(timeout=120)
    run = uuid.uuid4().hex
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="tool-gc-"))
    config = {
        "server": {"port": port, "log_level": "warning"},
        "backends": [{"name": "sim-0", "type": "sim", "sim": {"time_scale": 100.0}}],
        "tools": {
            "docker": {
                "enabled": True,
                "journal_path": str(tmp / "journal.sqlite3"),
                "stop_timeout_s": 0,
                "sweep_interval_s": 0.5,
                "templates": [
                    {
                        "name": "box",
                        "image": IMAGE,
                        "command": ["sleep", "600"],
                        "labels": {"thunder-mw.bench": run},
                        "pool_size": args.pool_size,
                    }
                ],
            }
        },
    }
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(config))
    disk_before, containers_before = managed_disk(client)
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "thunder_mw.cli.main",
            "serve",
            "-c",
            str(tmp / "gateway.yaml"),
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, timeout_s=60, process=gateway)
        started = time.perf_counter()
        results, peak = asyncio.run(drive(url, client, args.programs, args.concurrency, run))
        elapsed = time.perf_counter() - started
        # Released programs' reclaims run in the background: wait until only the pool is left.
        ours = {"label": f"thunder-mw.bench={run}"}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if len(client.api.containers(all=True, quiet=True, filters=ours)) <= args.pool_size:
                break
            time.sleep(0.2)
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(120)
    leaked = client.api.containers(all=True, quiet=True, filters=ours)
    disk_after, containers_after = managed_disk(client)
    warm = [r["handout_s"] for r in results if r["warm"]]
    cold = [r["handout_s"] for r in results if not r["warm"]]
    report = {
        "programs": args.programs,
        "concurrency": args.concurrency,
        "pool_size": args.pool_size,
        "elapsed_s": round(elapsed, 2),
        "released": sum(r["released"] for r in results),
        "handouts_warm": len(warm),
        "handouts_cold": len(cold),
        "handout_warm_median_s": round(statistics.median(warm), 4) if warm else None,
        "handout_cold_median_s": round(statistics.median(cold), 4) if cold else None,
        "managed_disk_bytes_last_sweep_of_run": peak["disk_bytes"],
        "managed_disk_bytes_before": disk_before,
        "managed_disk_bytes_after": disk_after,
        "managed_containers_before": containers_before,
        "managed_containers_after": containers_after,
        "leaked_containers": len(leaked),
        "engine": client.version().get("Version"),
    }
    write_result(args.out, report)
    print(json.dumps(report, indent=2))
    for c in leaked:
        client.api.remove_container(c["Id"], force=True, v=True)
    ok = not leaked and disk_after == disk_before and report["released"] == args.programs
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
