"""What a Prometheus scrape of /metrics costs with 10,000 live programs (target: < 50 ms).

Builds the gateway's real metrics registry (GatewayMetrics with every collector the app
registers) over a scheduler core holding `--programs` programs spread over 8 backends in
every state (reasoning, acting, paused and queued), then times `generate_latest` - the
body of GET /metrics - and, for reference, the dashboard's JSON snapshot.

    python -m thunder_mw.lab.metrics_scrape [--programs 10000] [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.engines.pool import BackendPool
from thunder_mw.middleware.live_scheduler import LiveScheduler
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.observability.service import Observability
from thunder_mw.policies.core import BackendMetrics, RequestInfo, SchedulerCore
from thunder_mw.policies.core_events import BackendChanged, CallFinished, RequestArrived
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.policies.stats import percentile
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention, ObservabilitySettings, ThunderConfig
from thunder_mw.schemas.views import encode

__all__ = ["BACKENDS", "OUTPUT", "TARGET_MS", "fleet", "main", "timed_ms"]

OUTPUT = RESULTS_DIR / "metrics-scrape.json"
TARGET_MS = 50.0
BACKENDS = 8


def fleet(programs: int, seed: int) -> tuple[GatewayMetrics, Observability, LiveScheduler]:
    """A gateway's metrics and scheduler with `programs` programs, about 1.3x over capacity."""
    rng = random.Random(seed)
    contexts = [rng.randint(2_000, 30_000) for _ in range(programs)]
    capacity = int(sum(contexts) / 1.3 / BACKENDS)
    config = ThunderConfig(
        backends=[
            {"name": f"b{i}", "url": f"http://127.0.0.1:{9000 + i}", "capacity_tokens": capacity}
            for i in range(BACKENDS)
        ]
    )
    pool = BackendPool(config.backends, config.server)
    core = SchedulerCore(pool.configured(), build_pipeline(config.policies))
    metrics = GatewayMetrics(core.state_counts, pool)
    observability = Observability(ObservabilitySettings(), core, pool, metrics)
    scheduler = LiveScheduler(
        pool,
        core,
        listeners=(observability.on_action,),
        tick_listeners=(observability.on_tick,),
    )
    now = 0.0
    for label in core.backend_views():
        metrics_seen = BackendMetrics(0.8, 40, 3, 12.0, 9e6, 1.2e7)
        scheduler.apply(core.handle(BackendChanged(label, now, metrics=metrics_seen)).actions)
    for i, context in enumerate(contexts):
        now += 0.001
        ctx = AgentContext(
            program_id=f"p{i}", source=Convention.THUNDERAGENT, session_type="swe-agent"
        )
        arrived = RequestArrived(ctx, RequestInfo(prompt_chars=context * 4), now)
        scheduler.apply(core.handle(arrived).actions)
        if rng.random() < 0.7:  # most programs have answered and are running a tool
            usage = Usage(context, 300, context // 2)
            scheduler.apply(core.handle(CallFinished(ctx.program_id, usage, True, now)).actions)
    return metrics, observability, scheduler


def timed_ms(fn: Any, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    metrics, observability, scheduler = fleet(args.programs, args.seed)
    body = generate_latest(metrics.registry)
    scrape = timed_ms(lambda: generate_latest(metrics.registry), args.runs)
    # As GET /dashboard/state answers it: built and encoded.
    snapshot = timed_ms(lambda: encode(observability.dashboard.snapshot()), max(5, args.runs // 5))
    states: dict[str, int] = {}
    for p in scheduler.programs():
        key = f"{p.state.value}/{p.phase.value}"
        states[key] = states.get(key, 0) + 1
    result = {
        "benchmark": "metrics-scrape",
        "target_ms": TARGET_MS,
        "programs": args.programs,
        "backends": BACKENDS,
        "programs_by_state": dict(sorted(states.items())),
        "queued": scheduler.core.queue_length(),
        "series": sum(1 for line in body.splitlines() if line and not line.startswith(b"#")),
        "body_bytes": len(body),
        "scrape_ms": {
            "median": round(statistics.median(scrape), 3),
            "p95": round(percentile(scrape, 95), 3),
            "max": round(max(scrape), 3),
            "runs": args.runs,
        },
        "dashboard_snapshot_ms": {
            "median": round(statistics.median(snapshot), 3),
            "max": round(max(snapshot), 3),
        },
        "met": max(scrape) < TARGET_MS,
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or None},
    }
    write_result(args.output, result)
    print(json.dumps(result, indent=2))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
