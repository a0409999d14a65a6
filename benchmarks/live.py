"""Live benchmark runs: the real gateway process in front of simulated engines over HTTP.

The same programs and fleet as a discrete-event run (benchmarks/des.py), but every request
really crosses thunder-mw: `thunder-mw serve` in its own process with `type: sim` backends,
the replay client in this one. Time is scaled (`time_scale` simulated seconds per wall
second), and so are the gateway's timers, so its ticks and probes fall at the same
simulated times as in the harness. Results use the harness's metric names.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml

from thunder_mw.benchmarks.des import ClusterConfig
from thunder_mw.benchmarks.engine_counters import read_counters
from thunder_mw.benchmarks.replay import Replayer, ReplayResult
from thunder_mw.benchmarks.server_process import stop_process, wait_until_healthy
from thunder_mw.benchmarks.workloads import ProgramSpec
from thunder_mw.policies.stats import percentile
from thunder_mw.sim.ports import free_port

__all__ = [
    "Gateway",
    "engines_gateway_config",
    "gateway_config",
    "live_metrics",
    "run_live",
    "steady_metrics",
]


def gateway_config(
    cluster: ClusterConfig, pipeline: list[dict[str, Any]], time_scale: float, port: int
) -> dict[str, Any]:
    backends = []
    for i in range(cluster.engines):
        engine = cluster.engine_config(i)
        backends.append(
            {
                "name": f"e{i}",
                "type": "sim",
                "sim": {
                    "flavor": "vllm",
                    "num_blocks": engine.num_blocks,
                    "block_size": engine.block_size,
                    "max_num_seqs": engine.max_num_seqs,
                    "max_num_batched_tokens": engine.max_num_batched_tokens,
                    "max_model_len": engine.max_model_len,
                    "profile": engine.profile,
                    "time_scale": time_scale,
                    "seed": engine.seed,
                },
            }
        )
    return _config(backends, cluster, pipeline, time_scale, port)


def engines_gateway_config(
    urls: list[str],
    cluster: ClusterConfig,
    pipeline: list[dict[str, Any]],
    time_scale: float,
    port: int,
) -> dict[str, Any]:
    """The gateway in front of engines already running at `urls` (vLLM's API)."""
    backends = [{"name": f"e{i}", "type": "vllm", "url": url} for i, url in enumerate(urls)]
    return _config(backends, cluster, pipeline, time_scale, port)


def _config(
    backends: list[dict[str, Any]],
    cluster: ClusterConfig,
    pipeline: list[dict[str, Any]],
    time_scale: float,
    port: int,
) -> dict[str, Any]:
    return {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "log_level": "warning",
            "tick_interval_s": cluster.tick_s / time_scale,
            "probe_interval_s": cluster.scrape_s / time_scale,
        },
        "backends": backends,
        "policies": pipeline,
    }


class Gateway:
    """`thunder-mw serve` in a subprocess, for the length of a `with` block."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.url = f"http://127.0.0.1:{config['server']['port']}"
        self._dir = tempfile.TemporaryDirectory()
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Gateway:
        path = Path(self._dir.name) / "gateway.yaml"
        path.write_text(yaml.safe_dump(self.config))
        with open(Path(self._dir.name) / "gateway.log", "wb") as log:  # the child keeps its own
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "thunder_mw.cli.main", "serve", "--config", str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        wait_until_healthy(
            self.url,
            timeout_s=60,
            process=self._proc,
            log_path=Path(self._dir.name) / "gateway.log",
            ready=lambda r: all(b["healthy"] for b in r.json()["backends"]),
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            stop_process(self._proc, timeout_s=20)
        self._dir.cleanup()

    @property
    def pid(self) -> int | None:
        """The gateway process's id (its memory is what the soak benchmark samples)."""
        return self._proc.pid if self._proc is not None else None

    def log_tail(self) -> str:
        path = Path(self._dir.name) / "gateway.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def engine_totals(self) -> dict[str, float]:
        """Prefix-cache, preemption and token counters summed over the gateway's engines."""
        backends = httpx.get(f"{self.url}/health", timeout=5).json()["backends"]
        return read_counters([b["url"] for b in backends], timeout_s=5)


def run_live(
    programs: list[ProgramSpec],
    cluster: ClusterConfig,
    pipeline: list[dict[str, Any]],
    *,
    time_scale: float,
    policy: str,
    stream: bool = True,
) -> dict[str, Any]:
    config = gateway_config(cluster, pipeline, time_scale, free_port())
    with Gateway(config) as gateway:
        before = gateway.engine_totals()
        replayer = Replayer(gateway.url, time_scale=time_scale, stream=stream)
        result = asyncio.run(replayer.run(programs))
        after = gateway.engine_totals()
    return {"policy": policy, **live_metrics(result, time_scale, before, after)}


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def live_metrics(
    result: ReplayResult,
    time_scale: float,
    before: dict[str, float],
    after: dict[str, float],
    concurrency: int | None = None,
) -> dict[str, Any]:
    """The harness's metrics, from what the client saw (times scaled to simulated seconds).
    `concurrency`: the replay was a closed loop of that many, so steady state is added."""
    t0 = result.started_at
    calls = [c for p in result.programs for c in p.calls if c.status == 200]
    failed_calls = sum(1 for p in result.programs for c in p.calls if c.status != 200)
    done = [p for p in result.programs if p.top_level and not p.failed and p.done_at]
    jct = sorted((p.done_at - p.arrived_at) * time_scale for p in done if p.done_at)
    ttft = sorted(
        (c.first_token_at - c.sent_at) * time_scale for c in calls if c.first_token_at is not None
    )
    last = max((c.done_at for c in calls if c.done_at), default=result.finished_at)
    makespan = (last - t0) * time_scale
    output = sum(c.completion_tokens for c in calls)
    queries = after["queries"] - before["queries"]
    steady = steady_metrics(result, time_scale, concurrency) if concurrency else {}
    return {
        "steps_per_min": round(len(calls) / (makespan / 60), 2) if makespan else 0.0,
        **steady,
        "output_tokens_per_s": round(output / makespan, 1) if makespan else 0.0,
        "jct_mean_s": round(sum(jct) / len(jct), 2) if jct else None,
        "jct_p95_s": _round(percentile(jct, 95)) if jct else None,
        "jct_p99_s": _round(percentile(jct, 99)) if jct else None,
        "jct_max_s": round(jct[-1], 2) if jct else None,
        "ttft_p99_s": _round(percentile(ttft, 99), 3) if ttft else None,
        "ttft_max_s": _round(ttft[-1] if ttft else None, 3),
        "prefix_hit_rate": round((after["hits"] - before["hits"]) / queries, 4) if queries else 0.0,
        "preemptions": int(after["preemptions"] - before["preemptions"]),
        "programs_completed": sum(1 for p in result.programs if not p.failed),
        "programs_failed": sum(1 for p in result.programs if p.failed),
        "failed_calls": failed_calls,
        "steps": len(calls),
        "makespan_s": round(makespan, 1),
        "wall_s": round(result.finished_at - t0, 1),
    }


def steady_metrics(
    result: ReplayResult, time_scale: float, concurrency: int, warmup_programs: int | None = None
) -> dict[str, Any]:
    """Steps/min of a closed loop at full concurrency after warm-up, in benchmarks/des.py's
    window: it opens when `warmup_programs` top-level programs have finished (as des.py's
    `Arrivals`: default half the concurrency) and closes when the last program starts
    (concurrency only falls after)."""
    warmup = max(1, warmup_programs or concurrency // 2)
    top = [p for p in result.programs if p.top_level]
    ends = sorted(p.done_at for p in top if p.done_at and not p.failed)
    if not top or len(ends) < warmup:
        return {"steps_per_min_steady": None, "steady_window_s": 0.0, "warmup_s": None}
    t0 = result.started_at
    warm, last_start = ends[warmup - 1], max(p.arrived_at for p in top)
    if last_start <= warm:
        return {"steps_per_min_steady": None, "steady_window_s": 0.0, "warmup_s": None}
    steps = sum(
        1
        for p in result.programs
        for c in p.calls
        if c.status == 200 and c.done_at and warm < c.done_at <= last_start
    )
    span = (last_start - warm) * time_scale
    return {
        "steps_per_min_steady": round(60 * steps / span, 2),
        "steady_window_s": round(span, 1),
        "warmup_s": round((warm - t0) * time_scale, 1),
    }
