"""Can the gateway learn an engine's fixed step time from what its scrapes carry?

A held program's worth, in a KV-bound batch, is the share of a step that does not grow with
the batch (`a` of the cost profile over the step's time): one more sequence adds that share
of a sequence's rate, not a whole one (docs/benchmarks.md, where cost-aware admission loses).
Live, `a` must be learned. This fits, per scrape interval of each engine and weighted by its
steps, the mean inter-token latency on what vLLM's metrics give (the prompt tokens computed
per step, the tokens decoded per step and, optionally, the KV in use) and compares the
intercept with the profile's `a`: without the KV term the context's cost lands in the
intercept.

python -m thunder_mw.lab.step_fit [SCENARIO:POLICY[:SEED] ...]   # writes ./results/step-fit.json
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from thunder_mw.benchmarks import bench_cli
from thunder_mw.benchmarks.des import Simulation
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.policies import BackendChanged, Event, Outcome
from thunder_mw.policies.events import BackendMetrics
from thunder_mw.sim.cost_model import get_profile

__all__ = ["DEFAULT_SPECS", "OUTPUT", "fit", "intervals", "main"]

OUTPUT = RESULTS_DIR / "step-fit.json"
DEFAULT_SPECS = (
    "paper-swe-glm46:thunder-mw",
    "dynamo-minimax:thunder-mw",
    "swe-agent-knee:thunder-mw",
)
# An interval of fewer engine steps says too little (one step is its mean); stricter than
# the gateway's own fit (policies/overflow_cost.py FIT_MIN_STEPS), which weighs by count.
MIN_STEPS = 20


def intervals(
    scrapes: Sequence[BackendMetrics], capacity: int
) -> list[tuple[list[float], float, float]]:
    """(regressors, mean inter-token latency, steps) per interval between two scrapes:
    regressors 1, prompt tokens computed per step, tokens decoded per step, KV tokens in use."""
    out = []
    for before, after in itertools.pairwise(scrapes):
        assert after.steps_total is not None and before.steps_total is not None
        steps = after.steps_total - before.steps_total
        decoded = (after.inter_tokens_total or 0.0) - (before.inter_tokens_total or 0.0)
        if steps < MIN_STEPS or decoded <= 0:
            continue
        seconds = (after.inter_token_seconds_total or 0.0) - (
            before.inter_token_seconds_total or 0.0
        )
        queries = (after.prefix_queries_total or 0.0) - (before.prefix_queries_total or 0.0)
        hits = (after.prefix_hits_total or 0.0) - (before.prefix_hits_total or 0.0)
        kv = (after.kv_usage or 0.0) * capacity
        out.append(([1.0, (queries - hits) / steps, decoded / steps, kv], seconds / decoded, steps))
    return out


def fit(rows: Sequence[tuple[list[float], float, float]], with_kv: bool) -> list[float]:
    """Weighted least squares (weights: steps) of the latency on the regressors."""
    cols = 4 if with_kv else 3
    x = np.array([r[0][:cols] for r in rows])
    y = np.array([r[1] for r in rows])
    w = np.sqrt(np.array([r[2] for r in rows]))
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    return [float(c) for c in coef]


def _run(spec: str) -> dict[str, Any]:
    scenario, jobs, seed = bench_cli.main_jobs(spec)
    sim = Simulation(*bench_cli.job_inputs(scenario, jobs[0], None))
    scrapes: dict[str, list[BackendMetrics]] = {}
    handle = sim.core.handle

    def seen(event: Event) -> Outcome:
        if isinstance(event, BackendChanged) and event.metrics is not None:
            if event.metrics.steps_total is not None:
                scrapes.setdefault(event.label, []).append(event.metrics)
        return handle(event)

    sim.core.handle = seen  # type: ignore[method-assign]
    sim.run()
    rows = []
    profiles = set()
    for i, label in enumerate(sorted(sim.backends)):
        config = sim.cluster.engine_config(i)
        profiles.add(config.profile)
        rows += intervals(scrapes.get(label, []), sim.backends[label].engine.capacity_tokens)
    if len(profiles) != 1 or len(rows) < 10:
        return {"spec": spec, "skipped": f"{len(profiles)} profiles, {len(rows)} intervals"}
    profile = get_profile(profiles.pop())
    without, with_kv = fit(rows, False), fit(rows, True)
    return {
        "spec": spec,
        "seed": seed,
        "profile": profile.source or sim.cluster.profile,
        "intervals": len(rows),
        "a_ms": round(profile.a * 1e3, 3),
        "d": profile.d,
        "a_hat_ms_without_kv": round(without[0] * 1e3, 3),
        "a_hat_ms_with_kv": round(with_kv[0] * 1e3, 3),
        "d_hat": with_kv[3],
        "mean_itl_ms": round(float(np.mean([r[1] for r in rows])) * 1e3, 3),
    }


def main(argv: Sequence[str]) -> int:
    results = [_run(spec) for spec in (argv or DEFAULT_SPECS)]
    for r in results:
        print(json.dumps(r), flush=True)
    write_result(OUTPUT, {"what": __doc__.splitlines()[0], "fits": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
