"""What one scheduling decision costs: the core's time per event with 10,000 live programs.

Every request through the gateway pays one `on_request` and one `on_finished`; the timer
pays `on_tick` each second. With the target (<= 50 us per event) the scheduler is never
the gateway's bottleneck. Two fleets: one with room for every program (`fits`) and one
where the programs' contexts exceed the KV capacity (`overloaded`: pauses, a global queue,
resumes on every release of room).

    python -m thunder_mw.lab.scheduler_cost [--programs 10000] [--events 50000]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from thunder_mw.benchmarks.bootstrap import mean_ci
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.policies.core import Forward, RequestInfo, SchedulerCore
from thunder_mw.policies.core_events import CallFinished, RequestArrived, Tick
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.policies.stats import percentile
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

__all__ = ["BLOCKS", "OUTPUT", "TARGET_US", "main", "measure", "run"]

OUTPUT = RESULTS_DIR / "scheduler-cost.json"
TARGET_US = 50.0
BLOCKS = 20  # contiguous stretches of a run the mean's interval is taken over


def measure(programs: int, events: int, backends: int, load: float, seed: int) -> dict[str, Any]:
    """Per-event cost once `programs` programs live; `load` = their contexts / capacity."""
    rng = random.Random(seed)
    context = [rng.randint(2_000, 30_000) for _ in range(programs)]
    capacity = int(sum(context) / load / backends)
    core = SchedulerCore([(f"b{i}", capacity) for i in range(backends)], build_pipeline(None))
    ctxs = [
        AgentContext(program_id=f"p{i}", source=Convention.THUNDERAGENT, session_type="swe")
        for i in range(programs)
    ]
    now = 0.0
    in_flight: set[int] = set()
    # Populate: every program made one call and is ACTING (or queued, when overloaded).
    for i in range(programs):
        now += 0.001
        arrived = RequestArrived(ctxs[i], RequestInfo(context[i] * 4, 256), now)
        if isinstance(core.handle(arrived).decision, Forward):
            core.handle(CallFinished(f"p{i}", Usage(context[i], 256), True, now))
    costs: dict[str, list[float]] = {"on_request": [], "on_finished": [], "on_tick": []}
    timeline: list[float] = []  # every event's cost in the order they ran
    clock = time.perf_counter_ns
    for _ in range(events):
        now += 0.002
        i = rng.randrange(programs)
        if i in in_flight:
            context[i] += rng.randint(50, 800)
            finished = CallFinished(f"p{i}", Usage(context[i], 256), True, now)
            t = clock()
            core.handle(finished)
            costs["on_finished"].append(cost := clock() - t)
            timeline.append(cost)
            in_flight.discard(i)
        else:
            arrived = RequestArrived(ctxs[i], RequestInfo(context[i] * 4, 256), now)
            t = clock()
            decision = core.handle(arrived).decision
            costs["on_request"].append(cost := clock() - t)
            timeline.append(cost)
            if isinstance(decision, Forward):
                in_flight.add(i)
        if int(now) != int(now - 0.002):
            tick = Tick(now)
            t = clock()
            core.handle(tick)
            costs["on_tick"].append(cost := clock() - t)
            timeline.append(cost)
    # The mean's interval over BLOCKS contiguous stretches of the run (batch means: costs
    # of neighbouring events are correlated, through the cache and the queue's length).
    size = len(timeline) // BLOCKS
    blocks = [statistics.fmean(timeline[k * size : (k + 1) * size]) / 1000 for k in range(BLOCKS)]
    low, high = mean_ci(blocks)
    return {
        "programs": programs,
        "backends": backends,
        "contexts_over_capacity": load,
        "events": len(timeline),
        "queued_at_end": core.queue_length(),
        "pauses": core.counts().get("pauses", 0),
        "resumes": core.counts().get("resumes", 0),
        "mean_us_per_event": round(statistics.fmean(timeline) / 1000, 2),
        # The mean's 95 % interval, as every result file names one (`ci95`).
        "ci95": [round(low, 2), round(high, 2)],
        "p99_us_per_event": round(percentile(timeline, 99) / 1000, 2),
        "by_event": {
            name: {
                "count": len(v),
                "mean_us": round(statistics.fmean(v) / 1000, 2) if v else None,
                "p99_us": round(percentile(v, 99) / 1000, 2) if v else None,
            }
            for name, v in costs.items()
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    cases = {
        "fits": measure(args.programs, args.events, args.backends, 0.5, args.seed),
        "overloaded": measure(args.programs, args.events, args.backends, 2.0, args.seed),
    }
    report = {
        "benchmark": "scheduler-cost",
        "pipeline": "thunder-mw (default)",
        "target_us_per_event": TARGET_US,
        "met": all(c["mean_us_per_event"] <= TARGET_US for c in cases.values()),
        "cases": cases,
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
    }
    write_result(Path(args.output), report)
    for name, case in cases.items():
        print(
            f"{name:10s} {case['programs']} programs: mean {case['mean_us_per_event']} us/event, "
            f"p99 {case['p99_us_per_event']} us ({case['events']} events, "
            f"{case['pauses']} pauses, {case['queued_at_end']} queued at the end)"
        )
    print(f"target <= {TARGET_US} us/event: {'met' if report['met'] else 'MISSED'}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--backends", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
