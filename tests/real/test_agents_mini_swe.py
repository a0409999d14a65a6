"""mini-SWE-agent (PyPI, unchanged) through thunder-mw on real Docker: each run's commands run in
its own container, which the gateway adopts from `docker_ids` and reclaims on release, on
the final flag and on idle expiry; the engines are simulated in scripted agent mode."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from support.asgi_servers import serving
from support.polling import wait_until

from thunder_mw.benchmarks.mini_swe_agent import (
    AgentRun,
    End,
    forget_containers,
    leftover_containers,
    run_agents,
    task_text,
)
from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

if TYPE_CHECKING:
    import docker


pytestmark = pytest.mark.slow

SIM = {"flavor": "vllm", "num_blocks": 2048, "profile": "h100-8b", "time_scale": 10.0}
IDLE_TTL_S = 4.0


def _config(tmp_path: Path) -> ThunderConfig:
    sim = {**SIM, "model_name": "sim-model", "scripted_agent": True}
    return ThunderConfig(
        server={"tick_interval_s": 0.1},
        backends=[{"name": f"sim-{i}", "type": "sim", "sim": {**sim, "seed": i}} for i in range(2)],
        policies=[
            {"admission": {"overflow": "cost_aware"}},
            {"state_aware_pause": {}},
            {"migration": {}},
            {"gc_hooks": {"idle_ttl_s": IDLE_TTL_S, "reclaim": ["stop", "remove"]}},
        ],
        tools={
            "docker": {
                "enabled": True,
                "journal_path": str(tmp_path / "journal.sqlite3"),
                "stop_timeout_s": 0,
                "sweep_interval_s": 0.1,
            }
        },
    )


def _reclaimed(url: str) -> dict[str, float]:
    found = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("thunder_mw_tool_containers_reclaimed_total{"):
            labels, _, value = line.rpartition(" ")
            found[labels.split('reason="')[1].split('"')[0]] = float(value)
    return found


def test_mini_swe_agent_runs_through_the_gateway_and_its_containers_are_reclaimed(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    prefix = f"msa-{time.monotonic_ns()}-"
    ends: tuple[End, ...] = ("release", "final", "expire", "release")
    tasks = [(f"{prefix}{i}", task_text(i, 0), end) for i, end in enumerate(ends)]
    app = create_app(_config(tmp_path))
    try:
        with serving(app) as gw:
            runs: list[AgentRun] = run_agents(gw.url, tasks, concurrency=len(tasks))

            for run in runs:
                assert run.error == "", run.error
                assert run.exit_status == "Submitted", (run.program_id, run.exit_status)
                assert run.submission.startswith("done "), run.submission
                assert run.container_id
                # Every step's prompt starts with the last one: the program's cache is hit
                # further at every step (it stays on its engine).
                assert len(run.cached_tokens) == run.steps >= 3
                growth = [
                    b - a
                    for a, b in zip(run.cached_tokens[:-1], run.cached_tokens[1:], strict=True)
                ]
                assert min(growth) > 0, run.cached_tokens

            profiles = httpx.get(f"{gw.url}/profiles", timeout=10).json()["profiles"]
            ours = {p["program_id"]: p for p in profiles if p["program_id"].startswith(prefix)}
            assert sorted(ours) == sorted(run.program_id for run in runs)
            for run in runs:
                closing = 1 if run.end == "final" else 0  # the call that carried the flag
                assert ours[run.program_id]["steps_total"] == run.steps + closing
                # The gateway's own record of each step's prefix hit is the engine's.
                steps = httpx.get(f"{gw.url}/profiles/{run.program_id}", timeout=10).json()
                cached = [step["cached_tokens"] for step in steps["steps"]][: run.steps]
                assert cached == run.cached_tokens

            # Every container is gone, reclaimed by the gateway for the reason its run gave.
            want = {"release": 2.0, "final": 1.0, "expired": 1.0}
            assert wait_until(
                lambda: _reclaimed(gw.url) == want,
                IDLE_TTL_S + 30,
                interval_s=0.2,
                message=lambda: f"every container reclaimed as {want}: {_reclaimed(gw.url)}",
            )
            assert wait_until(lambda: not leftover_containers(prefix), 30, interval_s=0.2)
            forget_containers(runs)
    finally:
        for cid in leftover_containers(prefix):
            docker_client.containers.get(cid).remove(force=True)
