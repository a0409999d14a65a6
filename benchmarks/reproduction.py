"""Seed spreads, the one-wave view and the published figures next to the measured ones.

`summarise_runs` turns the runs of one scenario (every policy x seed x point) into what the
result JSON reports besides the per-policy records: the steady-state spread over seeds at
each point, the one-wave (RL batch) run, and for each published figure the simulator's ratio
for the same pair of systems, paired by seed, with the gap. Within ±30 % counts as
reproduced.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from thunder_mw.benchmarks.scenarios import Scenario

__all__ = [
    "HOST_KV_BYTES",
    "REPRODUCED_WITHIN",
    "SPREAD_METRICS",
    "best_baseline",
    "format_reproduction",
    "host_tier_options",
    "host_tier_tokens",
    "summarise_runs",
]

REPRODUCED_WITHIN = 0.30
SPREAD_METRICS = (
    "steps_per_min_steady",
    "output_tokens_per_s_steady",
    "steps_per_min",
    "jct_mean_s",
    "jct_p95_s",
    "jct_max_s",
    "jct_max_over_median",
    "prefix_hit_rate",
    "preemptions",
    "recomputed_prefill_tokens",
)


# The host RAM a node gives the KV tier, per engine of a cost profile: an 8xH100 node
# (NVIDIA DGX H100: 2 TB of system memory) gives half of it to KV, the rest to the OS, the
# engine and the agents' tools; a TP4 replica gets half the node's share, a one-GPU 8B
# engine an eighth. The RTX 5090 box is a workstation: 128 GB of RAM assumed (not a cited
# figure), half of it for KV. Tokens = bytes / the profile's KV bytes per token.
HOST_KV_BYTES = {
    "h100x8-glm46-fp8": 1.0e12,
    "h100x8-qwen3-235b-fp8": 1.0e12,
    "h100x4-minimax-m2-fp8": 0.5e12,
    "h100-8b": 0.125e12,
    "rtx5090-qwen3-8b": 64e9,
}


def host_tier_tokens(profile: str, gpu_kv_tokens: int | None = None) -> int:
    """KV tokens a host tier of `profile`'s node holds (HOST_KV_BYTES), in proportion to
    the engine's GPU KV: a scenario that cuts the GPU cache below the profile's own capacity
    (to put a small fleet under pressure) cuts the tier by the same factor. One rule for
    every scenario: the node's host-to-GPU KV ratio is kept (8B on an H100: 2.04x, beside
    SGLang HiCache's default --hicache-ratio of 2), never a full node's RAM behind a
    fraction of a GPU (that made the 8B fleets' tier 7.3x their GPU cache, where nothing
    the gateway decides matters: everything fits)."""
    from thunder_mw.sim.cost_model import get_profile

    cost = get_profile(profile)
    if profile not in HOST_KV_BYTES or not cost.kv_bytes_per_token:
        raise ValueError(f"no host RAM size known for profile {profile!r}")
    tokens = HOST_KV_BYTES[profile] // cost.kv_bytes_per_token
    if gpu_kv_tokens is not None and cost.capacity_tokens:
        tokens = tokens * gpu_kv_tokens / cost.capacity_tokens
    return int(tokens)


def host_tier_options(host_tokens: int) -> tuple[tuple[str, Any], ...]:
    """EngineConfig fields that give an engine a host KV tier of `host_tokens` tokens (its
    load speed: the cost profile's host link over its KV bytes per token)."""
    return (("host_kv_tokens", host_tokens),)


def _spread(raw: list[Any]) -> dict[str, float] | None:
    values = [v for v in raw if v is not None]
    if not values:
        return None
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "n": len(values),
    }


def _point_key(row: dict[str, Any]) -> tuple[int, int]:
    return row["engines"], row["programs_per_engine"]


def summarise_runs(
    scenario: Scenario, policies: list[str], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The steady-state spread per point and policy, the one-wave runs, the reproduction."""
    steady_rows = [r for r in rows if not r["wave"]]
    by_point: dict[tuple[int, int], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for row in steady_rows:
        by_point[_point_key(row)][row["policy"]].append(row)
    steady = []
    for (engines, per), runs in sorted(by_point.items()):
        for policy in policies:
            if policy not in runs:
                continue
            seeded = sorted(runs[policy], key=lambda r: r["seed"])
            steady.append(
                {
                    "policy": policy,
                    "engines": engines,
                    "programs_per_engine": per,
                    "seeds": [r["seed"] for r in seeded],
                    **{m: _spread([r.get(m) for r in seeded]) for m in SPREAD_METRICS},
                }
            )
    wave = [
        {"policy": r["policy"], "seed": r["seed"], **{k: v for k, v in r.items() if k != "policy"}}
        for r in rows
        if r["wave"]
    ]
    main = (scenario.engines, scenario.programs_per_engine)
    reproduction = []
    for pub in scenario.published:
        point = (
            (pub.engines, pub.programs_per_engine or scenario.programs_per_engine)
            if pub.engines is not None
            else main
        )
        ratios = _paired_ratios(by_point.get(point, {}), pub.policy, pub.baseline, pub.metric)
        # thunder-mw over the same baseline, for the README's lead (not part of the source).
        ours = _paired_ratios(by_point.get(point, {}), "thunder-mw", pub.baseline, pub.metric)
        measured = statistics.median(ratios) if ratios else None
        gap = None if measured is None else round(measured / pub.ratio - 1, 3)
        reproduction.append(
            {
                "figure": pub.figure,
                "source": pub.source,
                "engines": point[0],
                "programs_per_engine": point[1],
                "metric": pub.metric,
                "policy": pub.policy,
                "baseline": pub.baseline,
                "published_ratio": round(pub.ratio, 3),
                "published_absolute": list(pub.absolute) if pub.absolute else None,
                "unit": pub.unit,
                "measured_ratio": None if measured is None else round(measured, 3),
                "measured_ratio_min": round(min(ratios), 3) if ratios else None,
                "measured_ratio_max": round(max(ratios), 3) if ratios else None,
                "measured_absolute": _medians(by_point.get(point, {}), pub, pub.metric),
                "gap": gap,
                "reproduced": gap is not None and abs(gap) <= REPRODUCED_WITHIN,
                "thunder_mw_ratio": round(statistics.median(ours), 3) if ours else None,
            }
        )
    return {"steady": steady, "wave": wave, "reproduction": reproduction}


def _paired_ratios(
    runs: dict[str, list[dict[str, Any]]], policy: str, baseline: str, metric: str
) -> list[float]:
    """policy / baseline on `metric`, seed by seed (same programs, same engines)."""
    base = {r["seed"]: r.get(metric) for r in runs.get(baseline, [])}
    out = []
    for r in runs.get(policy, []):
        b = base.get(r["seed"])
        v = r.get(metric)
        if b and v is not None:
            out.append(v / b)
    return out


def _medians(runs: dict[str, list[dict[str, Any]]], pub: Any, metric: str) -> list[float | None]:
    def median(policy: str) -> float | None:
        values = [float(r[metric]) for r in runs.get(policy, []) if r.get(metric) is not None]
        return round(statistics.median(values), 1) if values else None

    return [median(pub.policy), median(pub.baseline)]


def best_baseline(report: dict[str, Any], metric: str = "steps_per_min_steady") -> str | None:
    """The strongest policy at the main point that is neither thunder-mw nor the original's
    rules, by the median of `metric` over seeds."""
    c = report["config"]
    best: tuple[float, str] | None = None
    for row in report.get("steady", []):
        if (row["engines"], row["programs_per_engine"]) != (c["engines"], c["programs_per_engine"]):
            continue
        if row["policy"] in ("thunder-mw", "thunderagent") or row["policy"].startswith(
            "thunder-mw/"
        ):
            continue
        spread = row.get(metric)
        if spread and (best is None or spread["median"] > best[0]):
            best = (spread["median"], row["policy"])
    return None if best is None else best[1]


def format_reproduction(report: dict[str, Any]) -> str:
    """Plain-text lines: steady spread per policy at the main point, then each figure."""
    lines = []
    c = report["config"]
    for row in report.get("steady", []):
        if (row["engines"], row["programs_per_engine"]) != (c["engines"], c["programs_per_engine"]):
            continue
        s = row.get("steps_per_min_steady")
        if s:
            lines.append(
                f"steady {row['policy']}: {s['median']:.1f} steps/min "
                f"(min {s['min']:.1f}, max {s['max']:.1f}, {s['n']} seeds)"
            )
    for r in report.get("reproduction", []):
        verdict = "reproduced" if r["reproduced"] else "NOT reproduced"
        lines.append(
            f"{r['figure']}: published {r['published_ratio']}, simulated {r['policy']}/"
            f"{r['baseline']} {r['measured_ratio']} (seeds {r['measured_ratio_min']}-"
            f"{r['measured_ratio_max']}), gap {r['gap']}: {verdict}; thunder-mw/"
            f"{r['baseline']} {r['thunder_mw_ratio']}"
        )
    return "\n".join(lines)
