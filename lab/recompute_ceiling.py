"""How far could removing recompute take a scenario? The vLLM router goal's ceiling.

The vLLM router goal (thunder-mw >= 1.1x `vllm_router_program`, long window) is judged on
engines without a host KV tier, where every context a program loses is recomputed. What
any scheduler gains there by keeping contexts is bounded by what recompute costs. This runs
each scenario's long window (every seed of the scenario, the published concurrency) on the
same engines given a *free tier*: a host KV tier with room for every context
(`FREE_TIER_TOKENS`) loading at `FREE_TIER_TOKENS_PER_S`, so a context evicted from the GPU
comes back for nothing, and no recompute is ever paid after a program's first prompt. The
GPU cache, its size and the cost of every other token are unchanged. Four pipelines run
there: plain consistent hashing (`offload`, which holds nothing), the router's stand-in, the
default, and the default whose admission prices an overflow at the tier's reload
(`thunder-mw/tier-reload`, opt-in) — and the router and the default on the untiered engines,
as published. Each row over the untiered router, paired by seed (95 % bootstrap interval):
the best free-tier row is what removing recompute alone would give the best of these
schedulers, so a goal above it is out of reach of anything that only saves recompute.

    python -m thunder_mw.lab.recompute_ceiling [--scenarios NAME ...] [--jobs 2]

writes results/recompute-ceiling.json (a diagnostic bound, not a hardware anyone runs;
docs/benchmarks.md, "What removing recompute would give").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from thunder_mw.benchmarks import bench_cli
from thunder_mw.benchmarks.bootstrap import compare
from thunder_mw.benchmarks.des import Simulation
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.scenarios import PUBLISHED_SCENARIOS, TEST_SCENARIOS
from thunder_mw.benchmarks.scenarios import SCENARIOS as ALL_SCENARIOS
from thunder_mw.lab.host_tier import per_seed

__all__ = [
    "BASELINE",
    "FREE_ROWS",
    "FREE_TIER_TOKENS",
    "FREE_TIER_TOKENS_PER_S",
    "GOAL",
    "SCENARIOS",
    "UNTIERED_ROWS",
    "main",
    "run_row",
    "summarise",
]

# The tuning and test scenarios (docs/benchmarks.md) but those whose main point is another's
# runs (`cluster-scaling`: `paper-rollout-2node`'s).
SCENARIOS = (
    *(name for name, s in PUBLISHED_SCENARIOS.items() if s.main_point_of is None),
    "swe-agent-knee",
    "tool-orchestra-knee",
    "chat-control",
    *TEST_SCENARIOS,
)
BASELINE = "vllm_router_program"
GOAL = 1.1
UNTIERED_ROWS = (BASELINE, "thunder-mw")
FREE_ROWS = ("offload", BASELINE, "thunder-mw", "thunder-mw/tier-reload")
# Room for every context a run opens (a billion tokens per engine: no scenario's programs
# together come near) and a load that takes no measurable time (10^13 tokens/s: a 100k-token
# context in 10 ns against the profiles' ~10^4-10^5 prefill tokens/s).
FREE_TIER_TOKENS = 10**9
FREE_TIER_TOKENS_PER_S = 1e13
_FREE_OPTIONS = (
    ("host_kv_tokens", FREE_TIER_TOKENS),
    ("host_load_tokens_per_s", FREE_TIER_TOKENS_PER_S),
)


# What each run keeps of its metrics.
_KEPT = ("steps_per_min_steady", "recomputed_prefill_tokens", "mean_batch")


def row_name(policy: str, free: bool) -> str:
    return f"{policy} @free-tier" if free else policy


def run_row(args: tuple[str, str, bool, int]) -> tuple[str, int, dict[str, Any]]:
    """One long-window run of `policy` in `scenario` at `seed`, its engines given the free
    tier where `free` (the pipeline and everything else as `thunder-mw bench` runs it)."""
    scenario_name, policy, free, seed = args
    scenario = ALL_SCENARIOS[scenario_name]
    # The main point's long-window run, as `thunder-mw bench` plans it.
    plan = bench_cli.plan_jobs(scenario, [policy], seed=seed, sweep=False, seeds=1)
    job = next(j for j in plan if j.main and not j.wave)
    programs_in, pipeline, cluster, arrivals, label = bench_cli.job_inputs(scenario, job, None)
    if free:
        options = dict(cluster.engine_options)
        options.update(_FREE_OPTIONS)
        cluster = replace(cluster, engine_options=tuple(options.items()))
    metrics = Simulation(programs_in, pipeline, cluster, arrivals, label).run().metrics
    return row_name(policy, free), seed, {k: metrics[k] for k in _KEPT}


def _committed(results: Path, scenario: str, policy: str) -> dict[int, float]:
    """`policy`'s steady steps/min per seed at the scenario's main point, as committed."""
    path = results / f"{scenario}.json"
    if not path.is_file():
        return {}
    return per_seed(json.loads(path.read_text()), policy, False, "steps_per_min_steady")


def summarise(runs: dict[str, dict[int, dict[str, Any]]], seeds: list[int]) -> dict[str, Any]:
    """Each row over the untiered router, paired by seed, and the best free-tier row."""
    base = [runs[BASELINE][s]["steps_per_min_steady"] for s in seeds]
    rows: dict[str, Any] = {}
    for name, by_seed in runs.items():
        mine = [by_seed[s]["steps_per_min_steady"] for s in seeds]
        recomputed = sum(by_seed[s]["recomputed_prefill_tokens"] for s in seeds) / len(seeds)
        rows[name] = {
            "over_router": compare(mine, base),
            "steps_per_min_steady": {s: by_seed[s]["steps_per_min_steady"] for s in seeds},
            "recomputed_prefill_tokens_mean": round(recomputed),
            "mean_batch_mean": round(sum(by_seed[s]["mean_batch"] for s in seeds) / len(seeds), 2),
        }
    free = [n for n in rows if n.endswith("@free-tier")]
    best = max(free, key=lambda n: rows[n]["over_router"]["ratio"])
    ceiling = rows[best]["over_router"]
    return {
        "rows": rows,
        "ceiling": {"row": best, **ceiling},
        # Out of reach of saving recompute where even the interval's top lies under the goal.
        "goal_within_ceiling": ceiling["ci95"][1] >= GOAL,
        "thunder_mw_over_router": rows["thunder-mw"]["over_router"],
    }


def main(argv: list[str] | None = None, results: Path = RESULTS_DIR) -> int:
    parser = argparse.ArgumentParser(prog="python -m thunder_mw.lab.recompute_ceiling")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--output", type=Path, default=results / "recompute-ceiling.json")
    args = parser.parse_args(argv)
    unknown = [n for n in args.scenarios if n not in ALL_SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    started = time.time()
    out: dict[str, Any] = {}
    for name in args.scenarios:
        seeds = list(range(ALL_SCENARIOS[name].seeds))
        tasks = [(name, p, False, s) for p in UNTIERED_ROWS for s in seeds]
        tasks += [(name, p, True, s) for p in FREE_ROWS for s in seeds]
        runs: dict[str, dict[int, dict[str, Any]]] = {}
        with ProcessPoolExecutor(args.jobs) as pool:
            for row, seed, metrics in pool.map(run_row, tasks):
                runs.setdefault(row, {})[seed] = metrics
        entry = summarise(runs, seeds)
        committed = _committed(results, name, BASELINE)
        entry["router_reproduces_committed"] = all(
            committed.get(s) == runs[BASELINE][s]["steps_per_min_steady"] for s in seeds
        )
        entry["seeds"] = seeds
        out[name] = entry
        ceiling = entry["ceiling"]
        print(
            f"{name}: thunder-mw {entry['thunder_mw_over_router']['ratio']}x the router; "
            f"ceiling {ceiling['ratio']}x {ceiling['ci95']} ({ceiling['row']}); "
            f"goal {GOAL}x within it: {entry['goal_within_ceiling']}",
            flush=True,
        )
    write_result(
        args.output,
        {
            "goal": GOAL,
            "baseline": BASELINE,
            "free_tier": dict(_FREE_OPTIONS),
            "free_rows": list(FREE_ROWS),
            "untiered_rows": list(UNTIERED_ROWS),
            "command": "python -m thunder_mw.lab.recompute_ceiling",
            "wall_s": round(time.time() - started, 1),
            "scenarios": out,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
